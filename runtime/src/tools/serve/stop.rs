//! Stop strings over streamed text: text is released only once it cannot be the start of a
//! stop string, and generation ends where the first stop string begins (which is not sent).

/// Watches generated text for any of the stop strings.
pub struct StopText {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
}

impl StopText {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> StopText {
        StopText { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Adds `text`; returns (the text that can be released now, whether a stop string was
    /// found — then everything from it on is dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Whatever is held at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_across_pieces_and_releases_safe_text() {
        let mut s = StopText::new(&["\nUser:".to_string(), "###".to_string()]);
        assert_eq!(s.push("Hello"), ("Hello".to_string(), false));
        assert_eq!(s.push(" there\nUs"), (" there".to_string(), false), "\\nUs may start a stop string");
        assert_eq!(s.push("ually"), ("\nUsually".to_string(), false));
        assert_eq!(s.push(" ok #"), (" ok ".to_string(), false));
        assert_eq!(s.push("## rest"), (String::new(), true));
    }

    #[test]
    fn without_stops_everything_passes() {
        let mut s = StopText::new(&[String::new()]);
        assert_eq!(s.push("a#b"), ("a#b".to_string(), false));
        assert_eq!(s.flush(), "");
    }
}
