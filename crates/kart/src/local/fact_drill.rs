//! Fact drills: the second lesson, looking a value up in what the model has read.
//!
//! The copy drills teach the model to repeat a run of words, where the token before each one is
//! the cue. Answering from search results asks for more: at "The birthplace of Fakgrov Dregen
//! is", find the passage that names Fakgrov Dregen and copy the city after "born in", a token
//! whose own predecessor is nowhere in the question. A warm start that has not formed that lookup
//! falls back on a prior: it copies names (which it cannot guess) and writes cities and years
//! from a distribution over the world's (seed 5 of issue 56 copied 34% of the probe's values).
//! A drill is a search result of [`DOCS`] passages about made-up persons and companies, written
//! with the corpus's own templates from the world's name words, cities and years, then
//! [`DOCS`] facts read from them in the words of the gold reasoning ("The birthplace of X is Y."),
//! in another order. The made-up values are drawn afresh for every drill, so copying them is the
//! only way to predict them, and the names are pairs of the world's name words that no entity
//! has, so no drill states anything about a held-out entity. As in the agent's search results,
//! the first entity's namesakes are beside it: one shares its last name word, one its first, so
//! the lookup has to match the whole name (a drill whose names share nothing is answered by
//! matching any one word, which the agent's searches, full of namesakes, punish).

use super::gold::capitalised;
use super::rng::Rng;
use super::world::{BIRTH_YEARS, Company, FOUNDING_YEARS, OCCUPATIONS, Person, Relation, World};
use kart_core::agent::search_r1::{RetrievalResult, contents, document, passages_to_string};
use kart_core::agent::trajectory::Trajectory;
use kart_model::ModelError;
use kart_tokenizer::Tokenizer;

/// Passages in a drill, as many as the agent's searches return.
pub const DOCS: usize = 3;

/// Names drawn for a made-up entity before one that no entity of the world has is given up on
/// (a world's pairs of name words are about a fifth unused).
const NAME_ATTEMPTS: usize = 64;

/// `count` drills (seeded): the search result of [`DOCS`] made-up entities' passages as the
/// prompt, and one fact of each, read from them, as an observation trained where it repeats the
/// passages (none when the world has no persons or companies to borrow names from).
pub fn fact_drills(
    world: &World,
    tokenizer: &Tokenizer,
    count: usize,
    seed: u64,
) -> Result<Vec<Trajectory>, ModelError> {
    if world.persons.len() < 2 || world.companies.is_empty() {
        return Ok(Vec::new());
    }
    let mut rng = Rng::stream(seed, "fact drills");
    (0..count)
        .map(|k| {
            let first = MadeUp::draw(world, None, &mut rng);
            let mut entities: Vec<MadeUp> = vec![first];
            // A world too small for namesakes (or for distinct names at all) ends the search.
            for tries in 1.. {
                if entities.len() == DOCS {
                    break;
                }
                // Alternately its first and its last name word, as a search for it returns them.
                let keep = if entities.len() % 2 == 1 { Keep::Last } else { Keep::First };
                let like = (tries <= NAME_ATTEMPTS).then(|| (&entities[0], keep));
                let entity = MadeUp::draw(world, like, &mut rng);
                if tries > 2 * NAME_ATTEMPTS || entities.iter().all(|e| e.name() != entity.name()) {
                    entities.push(entity);
                }
            }
            let results: Vec<RetrievalResult> = entities
                .iter()
                .map(|e| {
                    let (title, text) = e.passage(world, &mut rng);
                    RetrievalResult { document: document(String::new(), contents(&title, &text)), score: 0.0 }
                })
                .collect();
            let mut order: Vec<usize> = (0..DOCS).collect();
            rng.shuffle(&mut order);
            let facts: Vec<String> = order.iter().map(|&i| entities[i].fact(world, &mut rng)).collect();
            let id = format!("fact-drill-{k}");
            let mut drill =
                Trajectory::new(id.clone(), id, &tokenizer.encode(&passages_to_string(&results), false)?);
            drill.push_env(&tokenizer.encode(&facts.join(" "), false)?);
            Ok(drill)
        })
        .collect()
}

/// A made-up person or company: a name from the world's name words, values drawn from its
/// cities, years, companies and persons.
enum MadeUp {
    Person(Person),
    Company(Company),
}

/// Which name word a drill's distractor shares with its first entity.
#[derive(Clone, Copy)]
enum Keep {
    First,
    Last,
}

impl MadeUp {
    /// A person or a company, in the world's proportion of them, named by a pair of the world's
    /// name words that no entity has (where the attempts find one). With `like`, one of the
    /// same kind that shares a name word with it: a search for a name returns the passages of
    /// namesakes too, so the drill's lookup has to match the whole name, as the agent's has.
    fn draw(world: &World, like: Option<(&MadeUp, Keep)>, rng: &mut Rng) -> MadeUp {
        let (persons, companies) = (world.persons.len(), world.companies.len());
        let is_person = match like {
            Some((entity, _)) => matches!(entity, MadeUp::Person(_)),
            None => rng.below(persons + companies) < persons,
        };
        let name_of = |i: usize| match is_person {
            true => world.persons[i].name.as_str(),
            false => world.companies[i].name.as_str(),
        };
        let n = if is_person { persons } else { companies };
        let mut name = String::new();
        for _ in 0..NAME_ATTEMPTS {
            let (first, last) = (name_of(rng.below(n)), name_of(rng.below(n)));
            let first = first.split_once(' ').map_or(first, |(f, _)| f);
            let last = last.rsplit_once(' ').map_or(last, |(_, l)| l);
            let (first, last) = match like.map(|(e, keep)| (e.name().split_once(' '), keep)) {
                Some((Some((kept, _)), Keep::First)) => (kept, last),
                Some((Some((_, kept)), Keep::Last)) => (first, kept),
                _ => (first, last),
            };
            name = format!("{first} {last}");
            if world.entity(&name).is_none() {
                break;
            }
        }
        match is_person {
            true => MadeUp::Person(Person {
                name,
                birthplace: rng.below(world.cities.len()),
                birth_year: rng.between(BIRTH_YEARS.0, BIRTH_YEARS.1),
                occupation: rng.pick(&OCCUPATIONS),
                employer: rng.below(companies),
                spouse: Some(rng.below(persons)),
            }),
            false => MadeUp::Company(Company {
                name,
                founded: rng.between(FOUNDING_YEARS.0, FOUNDING_YEARS.1),
                headquarters: rng.below(world.cities.len()),
            }),
        }
    }

    fn name(&self) -> &str {
        match self {
            MadeUp::Person(p) => &p.name,
            MadeUp::Company(c) => &c.name,
        }
    }

    /// The title and text of its passage, in one of the corpus's templates.
    fn passage(&self, world: &World, rng: &mut Rng) -> (String, String) {
        match self {
            MadeUp::Person(p) => (p.name.clone(), world.person_text(p, rng.below(3))),
            MadeUp::Company(c) => (c.name.clone(), world.company_text(c, rng.below(3))),
        }
    }

    /// One of its facts, as gold reasoning states it: "The birthplace of X is Y."
    fn fact(&self, world: &World, rng: &mut Rng) -> String {
        use Relation::*;
        let (name, relation, value) = match self {
            MadeUp::Person(p) => {
                let relation = rng.pick(&[Birthplace, BirthYear, Spouse, Employer]);
                (&p.name, relation, world.person_value(p, relation))
            }
            MadeUp::Company(c) => {
                let relation = rng.pick(&[Founded, Headquarters]);
                (&c.name, relation, world.company_value(c, relation))
            }
        };
        let (value, _) = value.expect("made-up persons are married, and each relation applies");
        format!("{} is {value}.", capitalised(&relation.phrase(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::copy_drill::small_world;

    #[test]
    fn a_drill_states_facts_its_passages_hold_about_entities_the_world_lacks() {
        let (world, tokenizer) = small_world();
        let drills = fact_drills(&world, &tokenizer, 20, 7).unwrap();
        assert_eq!(drills.len(), 20);
        let relations = ["birthplace", "birth year", "spouse", "employer", "founding year", "headquarters"];
        let mut made_up = 0;
        for drill in &drills {
            let prompt = tokenizer.decode(&drill.token_ids()[..drill.prompt_len()], false).unwrap();
            let response = tokenizer.decode(drill.response_ids(), false).unwrap();
            assert_eq!(prompt.matches("Doc ").count(), DOCS, "{prompt}");
            // The first entity's namesakes: one shares its last name word, one its first.
            let titles: Vec<(&str, &str)> = prompt
                .split("(Title: \"")
                .skip(1)
                .map(|t| t.split_once('"').unwrap().0.split_once(' ').unwrap())
                .collect();
            assert_eq!((titles[1].1, titles[2].0), (titles[0].1, titles[0].0), "{prompt}");
            assert!(titles[1].0 != titles[0].0 && titles[2].1 != titles[0].1, "{prompt}");
            let facts: Vec<&str> = response.split_terminator('.').map(str::trim).collect();
            assert_eq!(facts.len(), DOCS, "{response}");
            for f in facts {
                let (relation, rest) = f.strip_prefix("The ").and_then(|f| f.split_once(" of ")).unwrap();
                assert!(relations.contains(&relation), "{f}");
                let (subject, value) = rest.split_once(" is ").unwrap();
                // The passage titled with the subject holds the value.
                let passage = prompt
                    .lines()
                    .find(|l| l.contains(&format!("(Title: \"{subject}\")")))
                    .unwrap_or_else(|| panic!("{subject} in {prompt}"));
                assert!(passage.contains(value), "{value} in {passage}");
                made_up += usize::from(world.entity(subject).is_none());
            }
        }
        // Names are new pairs of the world's words, none an entity of the world.
        assert_eq!(made_up, 60);
        let ids = |d: &[Trajectory]| d.iter().map(|t| t.token_ids().to_vec()).collect::<Vec<_>>();
        assert_eq!(ids(&drills), ids(&fact_drills(&world, &tokenizer, 20, 7).unwrap()));
        assert_ne!(ids(&drills), ids(&fact_drills(&world, &tokenizer, 20, 8).unwrap()));
    }
}
