//! A bare list of addresses, one a line: `0x...` or `[0x...]`.

use super::{mark_unwound_return_addresses, parse_hex, Format, Found, TextFrame, TextThread};

pub(super) struct Addresses;

impl Format for Addresses {
    /// One thread, innermost first.
    fn parse(&self, lines: &[&str]) -> Option<Found> {
        let mut frames: Vec<TextFrame> = lines
            .iter()
            .filter_map(|l| {
                let l = l.trim();
                let l = l
                    .strip_prefix('[')
                    .and_then(|r| r.strip_suffix(']'))
                    .unwrap_or(l);
                parse_hex(l)
            })
            .map(TextFrame::at)
            .collect();
        if frames.is_empty() {
            return None;
        }
        mark_unwound_return_addresses(&mut frames, None);
        Some(Found {
            threads: vec![TextThread::nth(1, frames)],
            format: "addresses",
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::stacks::text::parse;

    #[test]
    fn bare_address_lists() {
        let p = parse("0x55d5f3a2c1af\n  [0x7f1e5e842520]\r\n0x10\n", "addrs").unwrap();
        assert_eq!(p.crash.format, "addresses");
        let frames: Vec<(Option<u64>, bool)> = p.threads[0]
            .frames
            .iter()
            .map(|f| (f.addr, f.is_return_address))
            .collect();
        assert_eq!(
            frames,
            vec![
                (Some(0x55d5f3a2c1af), false),
                (Some(0x7f1e5e842520), true),
                (Some(0x10), true)
            ]
        );
    }
}
