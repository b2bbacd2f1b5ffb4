//! How a profile is drawn: its title, units, colours and the facts written with it.

use crate::profile::Profile;

/// Flame graph colour palettes (FlameGraph's `--colors`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Palette {
    /// Red-yellow: CPU.
    #[default]
    Hot,
    /// Green-blue: memory.
    Mem,
    /// Blue: I/O and off-CPU waits.
    Io,
}

impl Palette {
    pub fn to_inferno(self) -> inferno::flamegraph::Palette {
        use inferno::flamegraph::color::BasicPalette;
        inferno::flamegraph::Palette::Basic(match self {
            Palette::Hot => BasicPalette::Hot,
            Palette::Mem => BasicPalette::Mem,
            Palette::Io => BasicPalette::Io,
        })
    }
}

/// How to render a profile.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub title: String,
    /// The name printed after values; `None` → `profile.unit.count_name()`.
    pub count_name: Option<String>,
    pub palette: Palette,
    /// Extra facts for JSON (and pprof comments): pid, duration, lost events...
    pub meta: serde_json::Map<String, serde_json::Value>,
    /// The values were scaled up from a sample, as this says: JSON's `estimated`, the SVG's subtitle.
    pub estimate: Option<String>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            title: "Flame Graph".to_string(),
            count_name: None,
            palette: Palette::Hot,
            meta: serde_json::Map::new(),
            estimate: None,
        }
    }
}

impl RenderOptions {
    /// The count name to print for `profile`.
    pub fn count_name_for(&self, profile: &Profile) -> String {
        self.count_name
            .clone()
            .unwrap_or_else(|| profile.unit.count_name().to_string())
    }
}
