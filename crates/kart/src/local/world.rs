//! The deterministic synthetic search world of `kart local`.
//!
//! A seed makes a world of invented cities (in invented countries), companies (founding year,
//! headquarters) and persons (birthplace, birth year, occupation, employer, spouse), all with
//! unique pronounceable names, so no model can know an answer without searching. The corpus holds
//! one short passage per entity plus distractor passages (events naming two persons, a city, a
//! year and a company) that share words with the entity passages. An entity passage names its
//! entity twice (title and text), others name it at most once, so a query holding the full name
//! ranks the entity's own passage first under BM25.
//!
//! Every person and company is the subject of exactly one question: single-hop (`nq`, "Where was
//! X born?") or two-hop through a spouse or an employer (`hotpotqa`, "Where is the headquarters
//! of the company that employs X?"). The split is by entity: the world is generated in three
//! partitions (spouses and employers never cross them), one per split: held-out test questions,
//! RL training questions and warm-start questions. No entity of a question (subject, bridge or
//! answer) occurs in a question of another split, so neither the held-out nor the RL questions
//! can be answered from what the supervised warm start memorised; only by searching.

use super::format::AgentFormat;
use super::names::Namer;
use super::rng::Rng;
use kart_core::agent::search_r1::PromptError;
use kart_core::agent::search_r1::contents;
use kart_core::wire::Task;
use kart_train::data::{DataError, write_search_r1};
use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The years persons are born in.
pub const BIRTH_YEARS: (u32, u32) = (1920, 1999);
/// The years companies are founded in.
pub const FOUNDING_YEARS: (u32, u32) = (1800, 1989);

/// What persons work as.
pub(super) const OCCUPATIONS: [&str; 20] = [
    "baker",
    "painter",
    "tailor",
    "farmer",
    "teacher",
    "pilot",
    "doctor",
    "nurse",
    "chemist",
    "sailor",
    "miner",
    "lawyer",
    "carpenter",
    "architect",
    "librarian",
    "engineer",
    "potter",
    "weaver",
    "surveyor",
    "clerk",
];
const INDUSTRIES: [&str; 16] = [
    "Dynamics",
    "Works",
    "Holdings",
    "Industries",
    "Labs",
    "Systems",
    "Foundry",
    "Textiles",
    "Motors",
    "Shipping",
    "Foods",
    "Optics",
    "Energy",
    "Press",
    "Pharma",
    "Instruments",
];

/// The size and shape of a world.
#[derive(Debug, Clone, PartialEq)]
pub struct WorldConfig {
    /// Seed of everything.
    pub seed: u64,
    /// Persons (each the subject of one question).
    pub persons: usize,
    /// Cities (birthplaces and headquarters).
    pub cities: usize,
    /// Companies (each the subject of one question).
    pub companies: usize,
    /// Distractor passages per person (each names two persons).
    pub distractors_per_person: f64,
    /// Share of two-hop questions in each split (at most the persons' share of the questions).
    pub two_hop_share: f64,
    /// Held-out questions (the size of the test partition, persons and companies).
    pub test_questions: usize,
    /// RL training questions (the size of the train partition); the persons and companies left
    /// after the test and train partitions are the warm start's.
    pub train_questions: usize,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            seed: 1,
            persons: 3000,
            cities: 150,
            companies: 300,
            distractors_per_person: 0.5,
            two_hop_share: 0.4,
            test_questions: 200,
            train_questions: 600,
        }
    }
}

/// Why a world cannot be made or written.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("world config: {field} = {value}: {reason}")]
    Config { field: &'static str, value: String, reason: &'static str },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
}

/// A city.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct City {
    pub name: String,
    pub country: String,
}

/// A company; `headquarters` indexes [`World::cities`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Company {
    pub name: String,
    pub founded: u32,
    pub headquarters: usize,
}

/// A person; `birthplace` indexes [`World::cities`], `employer` [`World::companies`], `spouse`
/// [`World::persons`] (none only for the odd one out of a partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub name: String,
    pub birthplace: usize,
    pub birth_year: u32,
    pub occupation: &'static str,
    pub employer: usize,
    pub spouse: Option<usize>,
}

/// An entity that can be asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entity {
    Person(usize),
    Company(usize),
}

/// What a hop asks of its subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Relation {
    /// Person -> city.
    Birthplace,
    /// Person -> year.
    BirthYear,
    /// Person -> person.
    Spouse,
    /// Person -> company.
    Employer,
    /// Company -> year.
    Founded,
    /// Company -> city.
    Headquarters,
}

impl Relation {
    /// The words after the subject's name in a gold query.
    pub fn query_words(self) -> &'static str {
        match self {
            Relation::Birthplace => "birthplace",
            Relation::BirthYear => "birth year",
            Relation::Spouse => "spouse",
            Relation::Employer => "employer",
            Relation::Founded => "founded",
            Relation::Headquarters => "headquarters",
        }
    }

    /// "the spouse of {subject}", as gold reasoning phrases it.
    pub fn phrase(self, subject: &str) -> String {
        let what = match self {
            Relation::Birthplace => "birthplace",
            Relation::BirthYear => "birth year",
            Relation::Spouse => "spouse",
            Relation::Employer => "employer",
            Relation::Founded => "founding year",
            Relation::Headquarters => "headquarters",
        };
        format!("the {what} of {subject}")
    }
}

/// One hop of a question's gold plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    pub relation: Relation,
    /// The search query of the gold trajectory: the subject's full name and the relation words.
    pub query: String,
    /// The title of the passage that answers the hop (the subject's name).
    pub title: String,
    /// The hop's answer: the bridge entity of a first hop, else the question's answer.
    pub answer: String,
}

/// A question with its answer and gold plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// `{data_source}/{row}`: the id [`kart_train::data::Dataset::load`] gives it when read back
    /// from its split's parquet file.
    pub id: String,
    pub question: String,
    pub answer: String,
    /// `nq` (single-hop) or `hotpotqa` (two-hop).
    pub data_source: String,
    pub hops: Vec<Hop>,
}

impl Question {
    /// The training prompt in `format` (the Search-R1 prompt around the question, or the
    /// question alone), the answer as ground truth.
    pub fn to_prompt(&self, format: AgentFormat) -> Result<Task, PromptError> {
        Ok(Task {
            id: self.id.clone(),
            messages: Some(format.prompt(&self.question)?),
            prompt: None,
            ground_truth: vec![self.answer.clone()],
            data_source: self.data_source.clone(),
            tools: None,
        })
    }
}

/// A corpus passage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    /// Its position in the corpus, as text.
    pub id: String,
    pub title: String,
    pub text: String,
}

/// Where [`World::write_dataset`] put the splits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetPaths {
    pub train: PathBuf,
    pub test: PathBuf,
    pub warm_start: PathBuf,
}

/// A generated world: its entities, corpus and questions.
#[derive(Debug, Clone)]
pub struct World {
    pub config: WorldConfig,
    pub cities: Vec<City>,
    pub companies: Vec<Company>,
    pub persons: Vec<Person>,
    /// Cities, companies, persons, then distractors.
    pub passages: Vec<Passage>,
    /// RL training questions (`train.parquet`).
    pub train: Vec<Question>,
    /// Held-out questions (`test.parquet`).
    pub test: Vec<Question>,
    /// Questions of the supervised warm start's gold trajectories (`warm-start.parquet`).
    pub warm_start: Vec<Question>,
    /// Entity by name.
    names: HashMap<String, Entity>,
}

impl World {
    /// Every year a passage or an answer may name (founding and birth years), as text.
    pub fn years() -> Vec<String> {
        let (founding, birth) = (FOUNDING_YEARS.0..=FOUNDING_YEARS.1, BIRTH_YEARS.0..=BIRTH_YEARS.1);
        let years: std::collections::BTreeSet<u32> = founding.chain(birth).collect();
        years.into_iter().map(|y| y.to_string()).collect()
    }

    /// Generates the world of `config`; the same config gives the same world on every platform.
    pub fn generate(config: &WorldConfig) -> Result<World, WorldError> {
        let partitions = validate(config)?;
        let seed = config.seed;
        let mut namer = Namer::new(Rng::stream(seed, "names"));
        let countries = namer.words(config.cities.div_ceil(12).max(1), 3);
        let mut rng = Rng::stream(seed, "cities");
        let cities: Vec<City> = (0..config.cities)
            .map(|_| City { name: namer.word(2), country: countries[rng.below(countries.len())].clone() })
            .collect();

        // Names are pairs of words from small shared pools, unique as pairs: every word recurs in
        // many names, so a small model sees each of its tokens often enough to learn to copy it
        // (names made of words seen once are never copied, whatever the training budget).
        let mut rng = Rng::stream(seed, "companies");
        let words = namer.words(config.companies.div_ceil(8).max(2), 2);
        let mut taken = HashSet::new();
        let companies: Vec<Company> = (0..config.companies)
            .map(|_| Company {
                name: unique_pair(&mut rng, &mut taken, &words, &INDUSTRIES),
                founded: rng.between(FOUNDING_YEARS.0, FOUNDING_YEARS.1),
                headquarters: rng.below(cities.len()),
            })
            .collect();

        let (first, last) = name_pools(config.persons);
        let first = namer.words(first, 2);
        let last = namer.words(last, 2);
        let mut rng = Rng::stream(seed, "persons");
        let mut taken = HashSet::new();
        let mut persons = Vec::with_capacity(config.persons);
        // Partitions are contiguous and in entity order; persons work for companies of their own.
        for Partition { persons: members, companies } in &partitions {
            for _ in members.clone() {
                let name = unique_pair(&mut rng, &mut taken, &first, &last);
                let employer = companies.start + rng.below(companies.len());
                persons.push(Person {
                    name,
                    birthplace: rng.below(cities.len()),
                    birth_year: rng.between(BIRTH_YEARS.0, BIRTH_YEARS.1),
                    occupation: rng.pick(&OCCUPATIONS),
                    employer,
                    spouse: None,
                });
            }
        }
        let mut rng = Rng::stream(seed, "couples");
        for range in partitions.iter().map(|p| p.persons.clone()) {
            let mut partition: Vec<usize> = range.collect();
            rng.shuffle(&mut partition);
            for pair in partition.chunks_exact(2) {
                persons[pair[0]].spouse = Some(pair[1]);
                persons[pair[1]].spouse = Some(pair[0]);
            }
        }

        let names = (persons.iter().enumerate().map(|(i, p)| (p.name.clone(), Entity::Person(i))))
            .chain(companies.iter().enumerate().map(|(i, c)| (c.name.clone(), Entity::Company(i))))
            .collect();
        let mut world = World {
            config: config.clone(),
            cities,
            companies,
            persons,
            passages: Vec::new(),
            train: Vec::new(),
            test: Vec::new(),
            warm_start: Vec::new(),
            names,
        };
        world.passages = world.corpus();
        let [test, train, warm_start] = partitions;
        world.test = world.questions(test.persons, test.companies, "test");
        world.train = world.questions(train.persons, train.companies, "train");
        world.warm_start = world.questions(warm_start.persons, warm_start.companies, "warm-start");
        Ok(world)
    }

    /// This world with the facts of its warm-start partition drawn again (seeded by `draw`):
    /// the same names, occupations and questions, the same test and train partitions (their
    /// passages word for word), new birthplaces, birth years, employers, spouses, founding years
    /// and headquarters for the warm start's persons and companies, and the corpus and
    /// warm-start answers that follow from them. Gold trajectories read from a fresh draw in
    /// each pass over the warm-start questions can only be predicted by copying what the
    /// searches return, never by recalling an earlier pass; draw 0 is this world.
    pub fn redrawn(&self, draw: u64) -> Result<World, WorldError> {
        if draw == 0 {
            return Ok(self.clone());
        }
        let [_, _, warm] = validate(&self.config)?;
        let mut world = self.clone();
        let mut rng = Rng::stream(self.config.seed ^ draw.rotate_left(32), "redrawn facts");
        for c in &mut world.companies[warm.companies.clone()] {
            c.founded = rng.between(FOUNDING_YEARS.0, FOUNDING_YEARS.1);
            c.headquarters = rng.below(self.cities.len());
        }
        for p in &mut world.persons[warm.persons.clone()] {
            p.birthplace = rng.below(self.cities.len());
            p.birth_year = rng.between(BIRTH_YEARS.0, BIRTH_YEARS.1);
            p.employer = warm.companies.start + rng.below(warm.companies.len());
        }
        // New couples among the married, so that the same persons are asked the same questions.
        let mut married: Vec<usize> =
            warm.persons.clone().filter(|&p| self.persons[p].spouse.is_some()).collect();
        rng.shuffle(&mut married);
        for pair in married.chunks_exact(2) {
            world.persons[pair[0]].spouse = Some(pair[1]);
            world.persons[pair[1]].spouse = Some(pair[0]);
        }
        world.passages = world.corpus();
        world.warm_start = world.questions(warm.persons, warm.companies, "warm-start");
        Ok(world)
    }

    /// The entity named `name`.
    pub fn entity(&self, name: &str) -> Option<Entity> {
        self.names.get(name).copied()
    }

    /// The name of an entity.
    pub fn name(&self, entity: Entity) -> &str {
        match entity {
            Entity::Person(i) => &self.persons[i].name,
            Entity::Company(i) => &self.companies[i].name,
        }
    }

    /// The value of `relation` for `subject` (a name or year) and the entity it names, if any;
    /// `None` when the relation does not apply (a company's spouse, an unmarried person's).
    pub fn follow(&self, subject: Entity, relation: Relation) -> Option<(String, Option<Entity>)> {
        match subject {
            Entity::Person(i) => self.person_value(&self.persons[i], relation),
            Entity::Company(i) => self.company_value(&self.companies[i], relation),
        }
    }

    /// [`World::follow`] for a person, who may be one the world does not hold.
    pub(super) fn person_value(&self, p: &Person, relation: Relation) -> Option<(String, Option<Entity>)> {
        Some(match relation {
            Relation::Birthplace => (self.cities[p.birthplace].name.clone(), None),
            Relation::BirthYear => (p.birth_year.to_string(), None),
            Relation::Spouse => {
                let spouse = p.spouse?;
                (self.persons[spouse].name.clone(), Some(Entity::Person(spouse)))
            }
            Relation::Employer => {
                (self.companies[p.employer].name.clone(), Some(Entity::Company(p.employer)))
            }
            Relation::Founded | Relation::Headquarters => return None,
        })
    }

    /// [`World::follow`] for a company, which may be one the world does not hold.
    pub(super) fn company_value(&self, c: &Company, relation: Relation) -> Option<(String, Option<Entity>)> {
        Some(match relation {
            Relation::Founded => (c.founded.to_string(), None),
            Relation::Headquarters => (self.cities[c.headquarters].name.clone(), None),
            _ => return None,
        })
    }

    /// The gold hops of asking `chain` about `subject`; `None` when a hop does not apply.
    pub fn hops(&self, subject: Entity, chain: &[Relation]) -> Option<Vec<Hop>> {
        let mut subject = Some(subject);
        chain
            .iter()
            .map(|&relation| {
                let entity = subject?;
                let title = self.name(entity).to_string();
                let (answer, next) = self.follow(entity, relation)?;
                subject = next;
                Some(Hop { relation, query: format!("{title} {}", relation.query_words()), title, answer })
            })
            .collect()
    }

    /// Writes the corpus as Search-R1 JSON lines: `{"id": …, "contents": "\"Title\"\ntext"}`.
    pub fn write_corpus(&self, path: &Path) -> Result<(), WorldError> {
        let io = |source| WorldError::Io { path: path.to_owned(), source };
        let mut out = BufWriter::new(std::fs::File::create(path).map_err(io)?);
        for p in &self.passages {
            let line = serde_json::json!({"id": p.id, "contents": contents(&p.title, &p.text)});
            writeln!(out, "{line}").map_err(io)?;
        }
        out.flush().map_err(io)
    }

    /// Writes `train.parquet`, `test.parquet` and `warm-start.parquet` (Search-R1 rows) into
    /// `dir`, creating it.
    pub fn write_dataset(&self, dir: &Path, format: AgentFormat) -> Result<DatasetPaths, WorldError> {
        std::fs::create_dir_all(dir).map_err(|source| WorldError::Io { path: dir.to_owned(), source })?;
        let paths = DatasetPaths {
            train: dir.join("train.parquet"),
            test: dir.join("test.parquet"),
            warm_start: dir.join("warm-start.parquet"),
        };
        for (questions, path, split) in [
            (&self.train, &paths.train, "train"),
            (&self.test, &paths.test, "test"),
            (&self.warm_start, &paths.warm_start, "warm-start"),
        ] {
            let prompts = questions.iter().map(|q| q.to_prompt(format)).collect::<Result<Vec<_>, _>>()?;
            let texts: Vec<String> = questions.iter().map(|q| q.question.clone()).collect();
            write_search_r1(path, &prompts, &texts, "fact-reasoning", split)?;
        }
        Ok(paths)
    }
}

/// Sizes of the first-name and surname pools for `persons` unique names: about 1.25 times as many
/// pairs as persons, with 1.5 surnames per first name.
fn name_pools(persons: usize) -> (usize, usize) {
    let pairs = persons as f64 * 1.25;
    let first = (pairs / 1.5).sqrt().ceil().max(2.0) as usize;
    (first, (pairs / first as f64).ceil().max(2.0) as usize)
}

/// A `"{a} {b}"` name not in `taken` (and now in it), drawn from the two pools.
fn unique_pair<A: AsRef<str>, B: AsRef<str>>(
    rng: &mut Rng,
    taken: &mut HashSet<String>,
    a: &[A],
    b: &[B],
) -> String {
    loop {
        let name = format!("{} {}", a[rng.below(a.len())].as_ref(), b[rng.below(b.len())].as_ref());
        if taken.insert(name.clone()) {
            return name;
        }
    }
}

/// The persons and companies of one partition of a world.
#[derive(Debug, Clone)]
struct Partition {
    persons: Range<usize>,
    companies: Range<usize>,
}

/// The test, train and warm-start partitions (in entity order), after checking `config`. A split
/// of `q` questions takes companies in proportion to the world's, at least one, and persons for
/// the rest.
fn validate(config: &WorldConfig) -> Result<[Partition; 3], WorldError> {
    let bad = |field, value: String, reason| Err(WorldError::Config { field, value, reason });
    if config.cities < 2 {
        return bad("cities", config.cities.to_string(), "a world needs at least two cities");
    }
    if config.persons < 2 {
        return bad("persons", config.persons.to_string(), "a world needs at least two persons");
    }
    if !(0.0..=1.0).contains(&config.two_hop_share) {
        return bad("two_hop_share", config.two_hop_share.to_string(), "must be between 0 and 1");
    }
    if !(config.distractors_per_person >= 0.0 && config.distractors_per_person <= 100.0) {
        let value = config.distractors_per_person.to_string();
        return bad("distractors_per_person", value, "must be between 0 and 100");
    }
    let total = config.persons + config.companies;
    let sizes = |questions: usize| {
        let companies = (questions * config.companies).div_ceil(total.max(1)).max(1);
        (questions.saturating_sub(companies), companies)
    };
    let (test_persons, test_companies) = sizes(config.test_questions);
    let (train_persons, train_companies) = sizes(config.train_questions);
    let room = "needs room for persons in the test, the train and the warm-start partitions";
    if config.test_questions == 0 || test_persons == 0 || test_persons >= config.persons {
        return bad("test_questions", config.test_questions.to_string(), room);
    }
    if config.train_questions == 0 || train_persons == 0 || test_persons + train_persons >= config.persons {
        return bad("train_questions", config.train_questions.to_string(), room);
    }
    if test_companies + train_companies >= config.companies {
        let reason =
            "needs at least one company in each of the test, the train and the warm-start partitions";
        return bad("companies", config.companies.to_string(), reason);
    }
    let (persons, companies) = (test_persons + train_persons, test_companies + train_companies);
    Ok([
        Partition { persons: 0..test_persons, companies: 0..test_companies },
        Partition { persons: test_persons..persons, companies: test_companies..companies },
        Partition { persons: persons..config.persons, companies: companies..config.companies },
    ])
}

#[cfg(test)]
pub(crate) mod tests;
