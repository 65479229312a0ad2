//! The corpus of a [`World`]: one short passage per entity, in a few templated variants, then
//! distractor passages.
//!
//! An entity passage names its entity in its title and once in its text; a distractor (an event
//! two persons met at, in a city, in a year, sponsored by a company) names each of its entities
//! once and states nothing a question asks, yet shares a gold query's subject words.

use super::rng::Rng;
use super::world::{Company, Passage, Person, World};
use std::collections::HashSet;

const EVENT_YEARS: (u32, u32) = (1950, 2019);
const EVENTS: [&str; 8] = [
    "Trade Fair",
    "Music Festival",
    "Chess Open",
    "Science Congress",
    "Marathon",
    "Art Exhibition",
    "Film Festival",
    "Book Fair",
];

impl World {
    /// One passage per city, company and person, in that order, then the distractors.
    pub(super) fn corpus(&self) -> Vec<Passage> {
        let mut rng = Rng::stream(self.config.seed, "corpus");
        let mut passages: Vec<(String, String)> = Vec::new();
        for city in &self.cities {
            passages.push((city.name.clone(), format!("{} is a city in {}.", city.name, city.country)));
        }
        for c in &self.companies {
            passages.push((c.name.clone(), self.company_text(c, rng.below(3))));
        }
        for p in &self.persons {
            passages.push((p.name.clone(), self.person_text(p, rng.below(3))));
        }
        // Events naming two persons, a city, a year and a company: they share every word of a
        // gold query's subject but answer nothing about it.
        let count = (self.config.distractors_per_person * self.persons.len() as f64).round() as usize;
        let mut titles = HashSet::new();
        for _ in 0..count.min(self.cities.len() * EVENTS.len() * 70) {
            let (title, city, event, year) = loop {
                let (city, event) = (&self.cities[rng.below(self.cities.len())].name, rng.pick(&EVENTS));
                let year = rng.between(EVENT_YEARS.0, EVENT_YEARS.1);
                let title = format!("{city} {event} {year}");
                if titles.insert(title.clone()) {
                    break (title, city, event, year);
                }
            };
            let a = rng.below(self.persons.len());
            let b = (a + 1 + rng.below(self.persons.len() - 1)) % self.persons.len();
            let sponsor = &self.companies[rng.below(self.companies.len())].name;
            let text = format!(
                "At the {event} in {city} in {year}, {} met {}. The event was sponsored by {sponsor}.",
                self.persons[a].name, self.persons[b].name
            );
            passages.push((title, text));
        }
        passages
            .into_iter()
            .enumerate()
            .map(|(i, (title, text))| Passage { id: i.to_string(), title, text })
            .collect()
    }

    /// The text of `c`'s passage in template `variant` (of 3).
    pub(super) fn company_text(&self, c: &Company, variant: usize) -> String {
        let (name, year, city) = (&c.name, c.founded, &self.cities[c.headquarters]);
        match variant {
            0 => format!("{name} was founded in {year} and has its headquarters in {}.", city.name),
            1 => format!("{name} is a company founded in {year} with headquarters in {}.", city.name),
            _ => {
                format!("Founded in {year}, {name} has its headquarters in {}, {}.", city.name, city.country)
            }
        }
    }

    /// The text of `p`'s passage in template `variant` (of 3).
    pub(super) fn person_text(&self, p: &Person, variant: usize) -> String {
        let (name, year, city) = (&p.name, p.birth_year, &self.cities[p.birthplace].name);
        let (job, company) = (with_article(p.occupation), &self.companies[p.employer].name);
        let spouse = p.spouse.map(|s| self.persons[s].name.as_str());
        match (variant, spouse) {
            (0, Some(s)) => {
                format!(
                    "{name} was born in {city} in {year}, works as {job} at {company} and is married to {s}."
                )
            }
            (0, None) => format!("{name} was born in {city} in {year} and works as {job} at {company}."),
            (1, Some(s)) => {
                format!("{name} is {job} at {company}, born in {year} in {city} and married to {s}.")
            }
            (1, None) => format!("{name} is {job} at {company}, born in {year} in {city}."),
            (_, Some(s)) => {
                format!(
                    "Born in {city} in {year}, {name} is married to {s} and works as {job} for {company}."
                )
            }
            (_, None) => format!("Born in {city} in {year}, {name} works as {job} for {company}."),
        }
    }
}

/// "an engineer", "a baker".
fn with_article(noun: &str) -> String {
    let vowel = noun.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {noun}", if vowel { "an" } else { "a" })
}
