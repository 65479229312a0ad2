//! The questions of a [`World`]: one per person and company of a partition, single-hop (`nq`)
//! or two-hop through a spouse or an employer (`hotpotqa`).

use super::rng::Rng;
use super::world::{Entity, Question, Relation, World};

impl World {
    /// One question per person of `persons` and company of `companies`, exactly
    /// `round(two_hop_share * total)` of them two-hop (persons first), in a shuffled order.
    pub(super) fn questions(
        &self,
        persons: std::ops::Range<usize>,
        companies: std::ops::Range<usize>,
        split: &str,
    ) -> Vec<Question> {
        use Relation::*;
        let mut rng = Rng::stream(self.config.seed, split);
        let mut subjects: Vec<usize> = persons.collect();
        rng.shuffle(&mut subjects);
        let total = subjects.len() + companies.len();
        let two_hop = ((self.config.two_hop_share * total as f64).round() as usize).min(subjects.len());
        let mut questions = Vec::with_capacity(total);
        for (k, &p) in subjects.iter().enumerate() {
            let married = self.persons[p].spouse.is_some();
            let chains: Vec<&[Relation]> = match k < two_hop {
                true => vec![
                    &[Spouse, Birthplace],
                    &[Spouse, BirthYear],
                    &[Spouse, Employer],
                    &[Employer, Founded],
                    &[Employer, Headquarters],
                ],
                false => vec![&[Birthplace], &[BirthYear], &[Spouse], &[Employer]],
            };
            let chains: Vec<&[Relation]> = chains.into_iter().filter(|c| married || c[0] != Spouse).collect();
            questions.push(self.question(Entity::Person(p), rng.pick(&chains)));
        }
        for c in companies {
            questions.push(self.question(Entity::Company(c), rng.pick(&[&[Founded][..], &[Headquarters]])));
        }
        rng.shuffle(&mut questions);
        for (row, q) in questions.iter_mut().enumerate() {
            q.id = format!("{}/{row}", q.data_source);
        }
        questions
    }

    fn question(&self, subject: Entity, chain: &[Relation]) -> Question {
        use Relation::*;
        let name = self.name(subject);
        let question = match chain {
            [Birthplace] => format!("Where was {name} born?"),
            [BirthYear] => format!("In what year was {name} born?"),
            [Spouse] => format!("Who is the spouse of {name}?"),
            [Employer] => format!("Which company employs {name}?"),
            [Founded] => format!("In what year was {name} founded?"),
            [Headquarters] => format!("Where is the headquarters of {name}?"),
            [Spouse, Birthplace] => format!("In which city was the spouse of {name} born?"),
            [Spouse, BirthYear] => format!("In what year was the spouse of {name} born?"),
            [Spouse, Employer] => format!("Which company employs the spouse of {name}?"),
            [Employer, Founded] => format!("In what year was the company that employs {name} founded?"),
            _ => format!("Where is the headquarters of the company that employs {name}?"),
        };
        let hops = self.hops(subject, chain).expect("question chains apply to their subjects");
        Question {
            id: String::new(),
            question,
            answer: hops.last().map(|h| h.answer.clone()).unwrap_or_default(),
            data_source: if hops.len() == 1 { "nq" } else { "hotpotqa" }.into(),
            hops,
        }
    }
}
