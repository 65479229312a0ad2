use super::*;
use kart_core::config::train::DataFormat;
use kart_train::data::Dataset;

/// A small world's settings (400 persons), for tests.
pub(crate) fn small(seed: u64) -> WorldConfig {
    WorldConfig {
        seed,
        persons: 400,
        cities: 30,
        companies: 40,
        test_questions: 50,
        train_questions: 100,
        ..WorldConfig::default()
    }
}

/// Occurrences of `name` as a whole run of words in `text`.
fn mentions(text: &str, name: &str) -> usize {
    let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let name: Vec<&str> = name.split(' ').collect();
    words.windows(name.len()).filter(|w| *w == name.as_slice()).count()
}

#[test]
fn the_same_seed_makes_the_same_world_and_another_seed_another() {
    let a = World::generate(&small(3)).unwrap();
    let b = World::generate(&small(3)).unwrap();
    assert_eq!(
        (&a.passages, &a.train, &a.test, &a.warm_start, &a.persons),
        (&b.passages, &b.train, &b.test, &b.warm_start, &b.persons)
    );
    let c = World::generate(&small(4)).unwrap();
    assert_ne!(a.passages, c.passages);
    assert_ne!(a.test, c.test);
    // Pinned so that a change of generation (which would change every run's data) is noticed.
    assert_eq!(a.persons[0].name, PINNED_FIRST_PERSON);
}

const PINNED_FIRST_PERSON: &str = "Hannin Shohik";

#[test]
fn names_are_unique_and_never_shared_across_kinds() {
    let world = World::generate(&WorldConfig::default()).unwrap();
    let persons: HashSet<&str> = world.persons.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(persons.len(), world.persons.len());
    let companies: HashSet<&str> = world.companies.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(companies.len(), world.companies.len());
    let cities: HashSet<&str> = world.cities.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(cities.len(), world.cities.len());
    let countries: HashSet<&str> = world.cities.iter().map(|c| c.country.as_str()).collect();
    // Invented words by kind: every word belongs to one kind only.
    let person_words: HashSet<&str> = world.persons.iter().flat_map(|p| p.name.split(' ')).collect();
    let stems: HashSet<&str> = world.companies.iter().map(|c| c.name.split(' ').next().unwrap()).collect();
    // Words recur across names (from small pools), so a small model sees each word often.
    let first_names: HashSet<&str> =
        world.persons.iter().map(|p| p.name.split(' ').next().unwrap()).collect();
    assert!(first_names.len() * 20 <= world.persons.len(), "{} first names", first_names.len());
    assert!(stems.len() * 4 <= world.companies.len(), "{} company words", stems.len());
    for (a, b) in [
        (&person_words, &stems),
        (&person_words, &cities),
        (&person_words, &countries),
        (&stems, &cities),
        (&stems, &countries),
        (&cities, &countries),
    ] {
        assert!(a.is_disjoint(b), "{:?}", a.intersection(b).collect::<Vec<_>>());
    }
    let titles: HashSet<&str> = world.passages.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(titles.len(), world.passages.len());
    for (i, p) in world.passages.iter().enumerate() {
        assert_eq!(p.id, i.to_string());
    }
}

#[test]
fn every_answer_is_stated_in_its_gold_passage_which_names_its_subject_most() {
    let world = World::generate(&small(5)).unwrap();
    let by_title: HashMap<&str, &Passage> = world.passages.iter().map(|p| (p.title.as_str(), p)).collect();
    for q in world.train.iter().chain(&world.test).chain(&world.warm_start) {
        assert_eq!(q.answer, q.hops.last().unwrap().answer);
        assert_eq!(q.data_source, if q.hops.len() == 1 { "nq" } else { "hotpotqa" });
        assert!(q.question.contains(&q.hops[0].title), "{q:?}");
        for (k, hop) in q.hops.iter().enumerate() {
            if k > 0 {
                assert_eq!(hop.title, q.hops[k - 1].answer);
            }
            assert_eq!(hop.query, format!("{} {}", hop.title, hop.relation.query_words()));
            let passage = by_title[hop.title.as_str()];
            assert!(mentions(&passage.text, &hop.answer) == 1, "{hop:?} not in {passage:?}");
        }
    }
    // Each entity's own passage names it twice (title and text), any other passage at most once,
    // so a query holding the full name favours the entity's own passage.
    let entities = world.persons.iter().map(|p| &p.name).chain(world.companies.iter().map(|c| &c.name));
    for name in entities {
        for p in &world.passages {
            let n = mentions(&contents(&p.title, &p.text), name);
            assert_eq!(n == 2, &p.title == name, "{name}: {p:?}");
            assert!(n <= 2);
        }
    }
}

#[test]
fn the_split_is_by_entity_and_sized_as_configured() {
    let config = WorldConfig { seed: 9, ..WorldConfig::default() };
    let world = World::generate(&config).unwrap();
    assert_eq!(world.test.len(), config.test_questions);
    assert_eq!(world.train.len(), config.train_questions);
    let questions = world.train.len() + world.test.len() + world.warm_start.len();
    assert_eq!(questions, config.persons + config.companies);
    for split in [&world.train, &world.test, &world.warm_start] {
        let two_hop = split.iter().filter(|q| q.hops.len() == 2).count();
        assert_eq!(two_hop, (config.two_hop_share * split.len() as f64).round() as usize);
        let ids: HashSet<&str> = split.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids.len(), split.len());
    }
    let entities = |split: &[Question]| -> HashSet<Entity> {
        let names = split.iter().flat_map(|q| q.hops.iter().flat_map(|h| [&h.title, &h.answer]));
        names.filter_map(|name| world.entity(name)).collect()
    };
    let (train, test, warm_start) =
        (entities(&world.train), entities(&world.test), entities(&world.warm_start));
    // Each partition is exactly its questions' subjects, bridges and answers.
    assert_eq!(test.len(), config.test_questions);
    assert_eq!(train.len(), config.train_questions);
    assert!(train.is_disjoint(&test));
    assert!(warm_start.is_disjoint(&test));
    assert!(warm_start.is_disjoint(&train));
}

#[test]
fn the_corpus_and_the_dataset_are_written_in_search_r1_formats() {
    let world = World::generate(&small(6)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.jsonl");
    world.write_corpus(&corpus).unwrap();
    let text = std::fs::read_to_string(&corpus).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), world.passages.len());
    assert_eq!(
        lines[7],
        serde_json::json!({"id": "7", "contents": contents(&world.passages[7].title, &world.passages[7].text)})
    );

    let paths = world.write_dataset(&dir.path().join("data"), AgentFormat::SearchR1).unwrap();
    for (path, questions) in
        [(&paths.train, &world.train), (&paths.test, &world.test), (&paths.warm_start, &world.warm_start)]
    {
        let read = Dataset::load(path, DataFormat::SearchR1, false, 0).unwrap();
        let expected: Vec<Task> =
            questions.iter().map(|q| q.to_prompt(AgentFormat::SearchR1).unwrap()).collect();
        assert_eq!(read.prompts, expected);
    }
    let prompt = world.test[0].to_prompt(AgentFormat::SearchR1).unwrap();
    assert!(
        prompt.messages.unwrap()[0].content.ends_with(&format!("Question: {}\n", world.test[0].question))
    );
}

#[test]
fn bad_configs_are_refused_naming_the_field() {
    let refused = |config: WorldConfig| match World::generate(&config) {
        Err(WorldError::Config { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused(WorldConfig { cities: 1, ..small(1) }), "cities");
    assert_eq!(refused(WorldConfig { two_hop_share: 1.5, ..small(1) }), "two_hop_share");
    assert_eq!(
        refused(WorldConfig { distractors_per_person: f64::NAN, ..small(1) }),
        "distractors_per_person"
    );
    assert_eq!(refused(WorldConfig { test_questions: 500, ..small(1) }), "test_questions");
    assert_eq!(refused(WorldConfig { test_questions: 0, ..small(1) }), "test_questions");
    assert_eq!(refused(WorldConfig { train_questions: 0, ..small(1) }), "train_questions");
    // 50 test and 400 train questions leave no person for the warm start.
    assert_eq!(refused(WorldConfig { train_questions: 400, ..small(1) }), "train_questions");
    assert_eq!(refused(WorldConfig { companies: 1, ..small(1) }), "companies");
}

#[test]
fn a_redrawn_world_keeps_its_names_and_questions_and_draws_the_warm_starts_facts_again() {
    let world = World::generate(&small(5)).unwrap();
    assert_eq!(world.redrawn(0).unwrap().passages, world.passages);
    let again = world.redrawn(1).unwrap();
    assert_eq!((&again.test, &again.train), (&world.test, &world.train));
    let names = |w: &World| w.persons.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&again), names(&world));
    let questions = |w: &World| w.warm_start.iter().map(|q| q.question.clone()).collect::<HashSet<_>>();
    assert_eq!(questions(&again), questions(&world));
    // The held-out and RL entities' passages are word for word the same; the warm start's differ.
    let held: HashSet<&str> =
        world.test.iter().chain(&world.train).map(|q| q.hops[0].title.as_str()).collect();
    let passage =
        |w: &'_ World, title: &str| w.passages.iter().find(|p| p.title == title).unwrap().text.clone();
    for title in &held {
        assert_eq!(passage(&again, title), passage(&world, title), "{title}");
    }
    let changed = world
        .warm_start
        .iter()
        .filter(|q| passage(&again, &q.hops[0].title) != passage(&world, &q.hops[0].title));
    assert!(changed.count() * 10 > world.warm_start.len() * 9, "most warm-start passages state new facts");
    let answers = |w: &World| {
        w.warm_start.iter().map(|q| (q.question.clone(), q.answer.clone())).collect::<HashMap<_, _>>()
    };
    let (before, after) = (answers(&world), answers(&again));
    let same = before.iter().filter(|(q, a)| after[*q] == **a).count();
    assert!(same * 4 < before.len(), "{same} of {} answers unchanged", before.len());
    // Each answer is what the redrawn world's passages state.
    for q in &again.warm_start {
        let hop = q.hops.last().unwrap();
        assert!(passage(&again, &hop.title).contains(&hop.answer), "{q:?}");
    }
    assert_eq!(world.redrawn(1).unwrap().passages, again.passages, "seeded");
    assert_ne!(world.redrawn(2).unwrap().passages, again.passages);
}
