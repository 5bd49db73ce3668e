//! Plotting that the harness and the benchmark share (`baton-bench`'s
//! compare.png and scale-<dim>.png use it, as do the harness's latency and
//! rate plots in [`crate::report`]): the font, and drawing a PNG into place.
//!
//! # Font
//! Text in the PNGs is rendered with plotters' `ab_glyph` backend, which has
//! no built-in font: the first [`render_png`] reads a TrueType font at run
//! time from [`FONT_PATH`] (Debian/Ubuntu package `fonts-dejavu-core`), or
//! from the file named by the environment variable [`FONT_ENV`] if set, and
//! registers it as plotters' `"sans-serif"` family for the whole process.
//! If the font cannot be read, [`render_png`] returns an error saying so.
//!
//! # Files
//! A PNG is drawn into a temporary file beside its path and renamed into
//! place, so a reader never sees half a picture, and a failed drawing
//! leaves no file.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// Default location of the TrueType font used for text in the PNGs.
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Environment variable that, if set, overrides [`FONT_PATH`].
pub const FONT_ENV: &str = "BATON_JEPSEN_FONT";

// ---------------------------------------------------------------------------
// Font
// ---------------------------------------------------------------------------

/// Registers the font once per process (plotters' font table is global).
/// The outcome, including a failure, is remembered.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = std::env::var_os(FONT_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(FONT_PATH));
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "cannot read the TrueType font {} needed to draw text in the PNG plots: {e} \
                 (install the Debian/Ubuntu package fonts-dejavu-core, or set {FONT_ENV} to a .ttf file)",
                path.display()
            )
        })?;
        // plotters keeps a `&'static [u8]`; this happens once per process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a valid TrueType/OpenType font", path.display()))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

// ---------------------------------------------------------------------------
// Drawing a PNG
// ---------------------------------------------------------------------------

pub type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

pub fn perr<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting failed: {e:?}")
}

/// Renders into a temporary `.png` next to `path` (plotters picks the image
/// format from the file extension, so this makes any `path` a PNG), then
/// renames it over `path`.
pub fn render_png(path: &Path, size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> Result<()>) -> Result<()> {
    ensure_font()?;
    let name = path.file_name().ok_or_else(|| anyhow!("{}: not a file path", path.display()))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp-{}.png", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| -> Result<()> {
        let root = BitMapBackend::new(&tmp, size).into_drawing_area();
        root.fill(&WHITE).map_err(perr)?;
        draw(&root)?;
        root.present().map_err(perr).with_context(|| format!("writing {}", tmp.display()))?;
        Ok(())
    })();
    match result {
        Ok(()) => {
            std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e.context(format!("drawing {}", path.display())))
        }
    }
}

pub fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}
