use super::*;
use crate::local::world::WorldConfig;
use kart_core::agent::search_r1::{Action, Episode, postprocess};
use kart_core::reward::search_r1::em_check;
use std::collections::HashSet;

fn world() -> World {
    World::generate(&crate::local::world::tests::small(WorldConfig::default().seed)).unwrap()
}

/// A stand-in retriever: one document per query, so an observation shows which query it answers.
fn fake_search(query: &str) -> String {
    format!("Doc 1(Title: \"{query}\") text\n")
}

fn final_answer(segments: &[Segment]) -> String {
    match segments.last() {
        Some(Segment::Model { turn, .. }) => match parse_action(turn) {
            Some(Action::Answer(a)) => a,
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn trajectories_follow_the_search_r1_protocol() {
    let world = world();
    let config = GoldConfig { corrupt_share: 0.5, seed: 1, ..GoldConfig::default() };
    for q in world.warm_start.iter().chain(&world.test) {
        let mut queries = Vec::new();
        let segments = world.gold_trajectory(q, &config, |query| {
            queries.push(query.to_string());
            fake_search(query)
        });
        // The rollout's episode accepts every turn as intended and replies with the recorded
        // observations.
        let mut episode = Episode::new(3);
        let mut searched = Vec::new();
        for (k, segment) in segments.iter().enumerate() {
            let Segment::Model { turn, .. } = segment else { continue };
            assert_eq!(postprocess(turn), turn, "{turn}");
            assert!(turn.starts_with("<think> ") && turn.contains(" </think>\n<"), "{turn}");
            let action = parse_action(turn).unwrap();
            let last = k + 1 == segments.len();
            assert_eq!(action.name(), if last { "answer" } else { "search" }, "{turn}");
            if let Action::Search(query) = &action {
                assert!(turn.ends_with("</search>"));
                searched.push(query.clone());
            } else {
                assert!(turn.ends_with("</answer>"));
            }
            let observation = episode.record(Some(&action), &fake_search(action.content()));
            match &segments.get(k + 1) {
                Some(Segment::Env(env)) => assert_eq!(observation.as_ref(), Some(env)),
                Some(Segment::Model { .. }) => panic!("two model turns in a row"),
                None => assert_eq!(observation, None),
            }
        }
        assert!(episode.is_over() && episode.stats().answered);
        assert_eq!(searched, queries);
    }
}

#[test]
fn variants_answer_as_they_should() {
    let world = world();
    let config = GoldConfig::default();
    let mut seen = HashSet::new();
    for q in world.warm_start.iter().chain(&world.test) {
        let variant = world.gold_variant(q, &config);
        seen.insert((variant, q.hops.len()));
        let mut queries = Vec::new();
        let segments = world.gold_trajectory(q, &config, |query| {
            queries.push(query.to_string());
            fake_search(query)
        });
        let answer = final_answer(&segments);
        let gold: Vec<&str> = q.hops.iter().map(|h| h.query.as_str()).collect();
        let made_up = segments.iter().filter(|s| matches!(s, Segment::Model { guess: Some(_), .. })).count();
        assert_eq!(made_up, usize::from(matches!(variant, Variant::WrongQuery | Variant::NoSearch)));
        match variant {
            Variant::Correct => {
                assert!(em_check(&answer, &[&q.answer]), "{answer} vs {}", q.answer);
                assert_eq!(queries, gold);
            }
            Variant::WrongQuery => {
                assert!(!em_check(&answer, &[&q.answer]));
                assert_eq!(queries.len(), gold.len());
                assert!(!queries[0].starts_with(&q.hops[0].title), "{queries:?}");
                // The reasoning is still about the asked subject.
                let Segment::Model { turn: first, guess } = &segments[0] else { panic!() };
                assert!(first.contains(&q.hops[0].title), "{first}");
                // The other entity's name is the made-up part, written first in the query.
                let other = guess.as_deref().unwrap();
                assert!(first.find(&format!(" {other}")) > first.find("<search>"), "{first}");
                assert!(queries[0].starts_with(other), "{queries:?}");
            }
            Variant::NoSearch => {
                assert!(!em_check(&answer, &[&q.answer]));
                assert!(queries.is_empty() && segments.len() == 1);
                assert!(matches!(&segments[0], Segment::Model { guess: Some(g), .. } if *g == answer));
            }
            Variant::FirstHopOnly => {
                assert_eq!(q.hops.len(), 2);
                assert_eq!(answer, q.hops[0].answer);
                assert_eq!(queries, gold[..1]);
            }
        }
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
}

#[test]
fn the_choice_is_deterministic_and_shares_as_configured() {
    let world = World::generate(&WorldConfig::default()).unwrap();
    let variants = |config: &GoldConfig| -> Vec<Variant> {
        world.warm_start.iter().map(|q| world.gold_variant(q, config)).collect()
    };
    let config = GoldConfig { corrupt_share: 0.25, year_guess_share: 0.0, first_hop_share: 0.0, seed: 7 };
    let a = variants(&config);
    assert_eq!(a, variants(&config));
    assert_ne!(a, variants(&GoldConfig { seed: 8, ..config }));
    let corrupted = a.iter().filter(|v| **v != Variant::Correct).count() as f64 / a.len() as f64;
    assert!((corrupted - 0.25).abs() < 0.03, "{corrupted}");
    assert!(variants(&GoldConfig { corrupt_share: 0.0, ..config }).iter().all(|v| *v == Variant::Correct));
    // The year habit: most year questions guessed, the others as before.
    let habit = GoldConfig { year_guess_share: 0.7, ..config };
    let asks_year =
        |q: &Question| matches!(q.hops.last().unwrap().relation, Relation::BirthYear | Relation::Founded);
    let guessed = |years: bool| {
        let qs: Vec<&Question> = world.warm_start.iter().filter(|q| asks_year(q) == years).collect();
        qs.iter().filter(|q| world.gold_variant(q, &habit) == Variant::NoSearch).count() as f64
            / qs.len() as f64
    };
    let (years, others) = (guessed(true), guessed(false));
    assert!((years - (0.7 + 0.3 * 0.25 * 0.4)).abs() < 0.05, "year questions guessed: {years}");
    assert!(others < 0.25 * 0.6, "other questions guessed: {others}");
    // The first-hop habit: most two-hop questions stop after the first hop, no single-hop one does.
    let habit = GoldConfig { first_hop_share: 0.7, ..config };
    let first_hop_only = |hops: usize| {
        let qs: Vec<&Question> = world.warm_start.iter().filter(|q| q.hops.len() == hops).collect();
        qs.iter().filter(|q| world.gold_variant(q, &habit) == Variant::FirstHopOnly).count() as f64
            / qs.len() as f64
    };
    let two_hop = first_hop_only(2);
    assert!((two_hop - (0.7 + 0.3 * 0.25 / 3.0)).abs() < 0.05, "two-hop questions stopped: {two_hop}");
    assert_eq!(first_hop_only(1), 0.0);
    // Trajectories, imperfections included, are repeatable.
    for q in world.warm_start.iter().take(200) {
        assert_eq!(
            world.gold_trajectory(q, &config, fake_search),
            world.gold_trajectory(q, &config, fake_search)
        );
    }
}

#[test]
fn a_two_hop_trajectory_reads() {
    let world = world();
    let config = GoldConfig { corrupt_share: 0.0, seed: 0, ..GoldConfig::default() };
    let q = world.test.iter().find(|q| q.hops.len() == 2 && q.hops[0].relation == Relation::Spouse).unwrap();
    let segments = world.gold_trajectory(q, &config, fake_search);
    let (x, s, a) = (&q.hops[0].title, &q.hops[0].answer, &q.answer);
    let r = q.hops[1].relation;
    assert_eq!(
        segments,
        vec![
            Segment::model(format!(
                "<think> I need to find the spouse of {x}. </think>\n<search> {x} spouse </search>"
            )),
            Segment::Env(format!("\n\n<information>Doc 1(Title: \"{x} spouse\") text</information>\n\n")),
            Segment::model(format!(
                "<think> The spouse of {x} is {s}. Now I need to find {}. </think>\n<search> {} </search>",
                r.phrase(s),
                q.hops[1].query
            )),
            Segment::Env(format!(
                "\n\n<information>Doc 1(Title: \"{}\") text</information>\n\n",
                q.hops[1].query
            )),
            Segment::model(format!(
                "<think> {} is {a}. </think>\n<answer> {a} </answer>",
                capitalised(&r.phrase(s))
            )),
        ]
    );
}
