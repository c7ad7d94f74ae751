//! Stop strings over streamed text: what can be sent now, and where a stop
//! string ends the text.

/// Tracks generated text against stop strings.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    text: String,
    sent: usize,
}

/// What a new piece of text allows.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Text that can be sent now (maybe empty: held back as a possible
    /// start of a stop string).
    Send(String),
    /// A stop string matched: send this last text and stop.
    Stop(String),
}

impl StopText {
    /// Track against `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        StopText {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// Add generated text.
    pub fn push(&mut self, piece: &str) -> Step {
        // A stop string may end in `piece` and start in held-back text.
        let from = self.sent;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(i) = hit {
            let out = self.text[self.sent..i].to_string();
            self.text.truncate(i);
            self.sent = i;
            return Step::Stop(out);
        }
        // Hold back the longest tail that is a prefix of a stop string.
        let mut safe = self.text.len();
        for (i, _) in self.text[self.sent..].char_indices() {
            let tail = &self.text[self.sent + i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                safe = self.sent + i;
                break;
            }
        }
        let out = self.text[self.sent..safe].to_string();
        self.sent = safe;
        Step::Send(out)
    }

    /// The text held back, sent at the end when no stop string matched.
    pub fn finish(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }

    /// All text so far (up to a matched stop string).
    #[cfg(test)]
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_split_across_pieces_is_held_back_then_cut() {
        let mut s = StopText::new(vec!["END".into()]);
        assert_eq!(s.push("hello E"), Step::Send("hello ".into()));
        assert_eq!(s.push("N"), Step::Send(String::new()));
        assert_eq!(s.push("Dx"), Step::Stop(String::new()));
        assert_eq!(s.text(), "hello ");
    }

    #[test]
    fn a_false_start_is_released() {
        let mut s = StopText::new(vec!["END".into(), String::new()]);
        assert_eq!(s.push("E"), Step::Send(String::new()));
        assert_eq!(s.push("x é"), Step::Send("Ex é".into()));
        assert_eq!(s.push("EN"), Step::Send(String::new()));
        assert_eq!(s.finish(), "EN");
        assert_eq!(s.text(), "Ex éEN");
    }

    #[test]
    fn the_earliest_stop_wins() {
        let mut s = StopText::new(vec!["cd".into(), "b".into()]);
        assert_eq!(s.push("abcd"), Step::Stop("a".into()));
    }
}
