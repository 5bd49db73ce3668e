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
//! Text is drawn by [`Backend`], not by plotters' `ab_glyph` code, which
//! draws each glyph where its ink starts instead of where its cell starts
//! (it drops the glyph's left side bearing), so a narrow digit shifts left
//! and numbers read split ("p99 1 9.8 ms"). [`Backend`] places every glyph
//! at its pen position plus its bearing, with the font's advances and
//! kerning, and keeps plotters' anchors, rotation and baseline.
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
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};

/// Default location of the TrueType font used for text in the PNGs.
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Environment variable that, if set, overrides [`FONT_PATH`].
pub const FONT_ENV: &str = "BATON_JEPSEN_FONT";

// ---------------------------------------------------------------------------
// Font
// ---------------------------------------------------------------------------

/// The font's bytes, once read.
static FONT_BYTES: OnceLock<&'static [u8]> = OnceLock::new();

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
        let invalid = || format!("{} is not a valid TrueType/OpenType font", path.display());
        ab_glyph::FontRef::try_from_slice(bytes).map_err(|_| invalid())?;
        let _ = FONT_BYTES.set(bytes);
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| invalid())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

// ---------------------------------------------------------------------------
// Drawing a PNG
// ---------------------------------------------------------------------------

pub type Area<'a> = DrawingArea<Backend<'a>, Shift>;

/// plotters' bitmap backend, with text drawn glyph by glyph where each
/// glyph belongs (the module doc).
pub struct Backend<'a> {
    inner: BitMapBackend<'a>,
    font: ab_glyph::FontRef<'static>,
}

type BackendResult<E> = std::result::Result<(), DrawingErrorKind<E>>;

impl Backend<'_> {
    /// Each glyph of `text` at `size` px, placed from the pen at 0 with the
    /// baseline at `size / 2` (where plotters puts it), and the advance.
    fn layout(&self, text: &str, size: f32) -> (Vec<ab_glyph::Glyph>, f32) {
        use ab_glyph::{Font, ScaleFont};
        let f = self.font.as_scaled(size);
        let (mut pen, mut prev, mut glyphs) = (0f32, None, Vec::with_capacity(text.len()));
        for c in text.chars() {
            let id = f.glyph_id(c);
            if let Some(p) = prev {
                pen += f.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(size, ab_glyph::point(pen, size / 2.0)));
            pen += f.h_advance(id);
            prev = Some(id);
        }
        (glyphs, pen)
    }
}

impl<'a> DrawingBackend for Backend<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> BackendResult<Self::ErrorType> {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> BackendResult<Self::ErrorType> {
        self.inner.present()
    }
    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> BackendResult<Self::ErrorType> {
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> BackendResult<Self::ErrorType> {
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> BackendResult<Self::ErrorType> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> BackendResult<Self::ErrorType> {
        self.inner.draw_path(path, style)
    }
    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> BackendResult<Self::ErrorType> {
        self.inner.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> BackendResult<Self::ErrorType> {
        self.inner.fill_polygon(vert, style)
    }
    fn blit_bitmap(&mut self, pos: BackendCoord, (iw, ih): (u32, u32), src: &[u8]) -> BackendResult<Self::ErrorType> {
        self.inner.blit_bitmap(pos, (iw, ih), src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> std::result::Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let (_, width) = self.layout(text, style.size() as f32);
        Ok((width.max(0.0) as u32, (style.size() / 1.24) as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> BackendResult<Self::ErrorType> {
        use ab_glyph::Font;
        use plotters_backend::text_anchor::{HPos, VPos};
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let size = style.size() as f32;
        let (glyphs, advance) = self.layout(text, size);
        let (width, height) = (advance as i32, (style.size() / 1.24) as i32);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        let mut ink = Vec::new();
        for g in glyphs {
            if let Some(q) = self.font.outline_glyph(g) {
                let r = q.px_bounds();
                q.draw(|x, y, cover| ink.push((r.min.x as i32 + x as i32, r.min.y as i32 + y as i32, cover)));
            }
        }
        for (x, y, cover) in ink {
            let (x, y) = trans.transform(x + dx, y + dy);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                let c = BackendColor { alpha: color.alpha * f64::from(cover), rgb: color.rgb };
                self.inner.draw_pixel((x, y), c)?;
            }
        }
        Ok(())
    }
}

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
        let bytes = FONT_BYTES.get().ok_or_else(|| anyhow!("the font was not loaded"))?;
        let font = ab_glyph::FontRef::try_from_slice(bytes).map_err(|e| anyhow!("the font: {e}"))?;
        let root = Backend { inner: BitMapBackend::new(&tmp, size), font }.into_drawing_area();
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

/// An axis tick or a value for people: no pointless `.0` (`1000`, not
/// `1000.0`), at most three decimals where the range needs them (`0.25`).
pub fn num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// `t` as `YYYY-MM-DD HH:MM UTC` (a figure's run date).
pub fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rem / 3_600, rem % 3_600 / 60)
}

/// Writes `run <date>` (or what `date` says) small, in the bottom right
/// corner of `root`: every figure carries the run it shows.
pub fn stamp(root: &Area<'_>, date: Option<&str>) -> Result<()> {
    let text = match date {
        Some(d) => format!("run {d}"),
        None => "run date not recorded".to_string(),
    };
    let (w, h) = root.dim_in_pixel();
    use plotters_backend::text_anchor::{HPos, Pos, VPos};
    let style = font(11).color(&RGBColor(0x55, 0x55, 0x55)).pos(Pos::new(HPos::Right, VPos::Bottom));
    root.draw(&Text::new(text, (w as i32 - 6, h as i32 - 4), style)).map_err(perr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leftmost and rightmost inked columns of `text` drawn at x = 10,
    /// 40 px high, by `draw` into a white buffer.
    fn ink(text: &str, through_backend: bool) -> (usize, usize) {
        ensure_font().expect("font");
        let (w, h) = (400u32, 80u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let bitmap = BitMapBackend::with_buffer(&mut buf, (w, h));
            let style = ("sans-serif", 40).into_font().color(&BLACK);
            if through_backend {
                let bytes = FONT_BYTES.get().expect("bytes");
                let font = ab_glyph::FontRef::try_from_slice(bytes).expect("font");
                let root = Backend { inner: bitmap, font }.into_drawing_area();
                root.draw(&Text::new(text.to_string(), (10, 20), style)).expect("draw");
                root.present().expect("present");
            } else {
                let root = bitmap.into_drawing_area();
                root.draw(&Text::new(text.to_string(), (10, 20), style)).expect("draw");
                root.present().expect("present");
            }
        }
        let inked: Vec<usize> =
            (0..w as usize).filter(|x| (0..h as usize).any(|y| buf[(y * w as usize + x) * 3] < 128)).collect();
        (inked[0], inked[inked.len() - 1])
    }

    /// A narrow glyph keeps its side bearing: "1" in DejaVu Sans starts
    /// about 0.11 em into its cell, so "11" is as wide as two cells, not
    /// two inks pressed left (plotters' own drawing puts the ink at the pen
    /// and reads "19.8" as "1 9.8").
    #[test]
    fn glyphs_keep_their_side_bearing() {
        let (left, _) = ink("1", true);
        assert!(left >= 13, "the ink of '1' starts {left} px in, not after its bearing");
        let (plotters_left, _) = ink("1", false);
        assert!(plotters_left <= 11, "plotters' own drawing was fixed ({plotters_left}): drop Backend");
        // One cell of "1" is as wide as one of "9": the gap between the
        // two is the font's, the same for "19" as for "99".
        let (l19, r19) = ink("19", true);
        let (l99, r99) = ink("99", true);
        assert!((r19 as i64 - r99 as i64).abs() <= 1, "19 ends at {r19}, 99 at {r99}");
        assert!(l19 > l99, "'1' starts further in than '9'");
    }

    #[test]
    fn numbers_and_dates_for_people() {
        assert_eq!(num(1000.0), "1000");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(0.25), "0.25");
        assert_eq!(num(1.0 / 3.0), "0.333");
        assert_eq!(num(-0.0001), "0");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_620_380);
        assert_eq!(utc_stamp(t), "2026-12-07 05:13 UTC");
        assert_eq!(
            utc_stamp(std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)),
            "2000-02-29 00:00 UTC"
        );
    }
}
