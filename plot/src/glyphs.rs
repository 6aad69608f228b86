//! Text in PNG charts, laid out glyph by glyph at its true position.
//!
//! plotters' bitmap text (its `ab_glyph` font code) draws each glyph's outline from the pen's
//! whole pixel and without the glyph's own left side bearing, so at label sizes neighbouring
//! glyphs touch ("nccl-tests" read "ncd-tests"). [`GlyphText`] wraps the bitmap backend and draws
//! text itself with `ab_glyph`: each glyph outlined at its fractional pen position (advance and
//! kerning, bearing included), then anchored and rotated as plotters does. Everything else is
//! the wrapped backend's, pixel for pixel.

use ab_glyph::{Font, FontRef, PxScale, ScaleFont, point};
use plotters::prelude::{BitMapBackend, DrawingBackend};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};

/// A bitmap backend whose text is drawn by [`draw_glyphs`].
pub(crate) struct GlyphText<'a> {
    inner: BitMapBackend<'a>,
    font: FontRef<'static>,
}

impl<'a> GlyphText<'a> {
    /// Wraps `inner`, drawing text with `font` (a TrueType font's bytes).
    pub(crate) fn new(inner: BitMapBackend<'a>, font: &'static [u8]) -> Result<Self, ab_glyph::InvalidFont> {
        Ok(GlyphText { inner, font: FontRef::try_from_slice(font)? })
    }
}

/// Calls `pixel(x, y, coverage)` for every pixel of `text` set in `font` at `size` pixels per
/// em, the pen starting at x = 0 with the baseline at y = `size / 2` (where plotters puts it,
/// so that layout boxes and anchors keep their meaning).
pub(crate) fn draw_glyphs(font: &FontRef<'_>, size: f32, text: &str, mut pixel: impl FnMut(i32, i32, f32)) {
    let scaled = font.as_scaled(PxScale::from(size));
    let mut pen = 0.0f32;
    let mut previous = None;
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(previous) = previous {
            pen += scaled.kern(previous, id);
        }
        previous = Some(id);
        let glyph = id.with_scale_and_position(PxScale::from(size), point(pen, size / 2.0));
        if let Some(outline) = font.outline_glyph(glyph) {
            let bounds = outline.px_bounds();
            outline.draw(|x, y, coverage| {
                pixel(bounds.min.x as i32 + x as i32, bounds.min.y as i32 + y as i32, coverage);
            });
        }
        pen += scaled.h_advance(id);
    }
}

impl DrawingBackend for GlyphText<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    /// As plotters' default (the layout box anchors the text, the style's transform rotates
    /// it), with the glyphs drawn by [`draw_glyphs`].
    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) =
            style.layout_box(text).map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
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
        let transform = style.transform();
        let (w, h) = self.get_size();
        let mut result = Ok(());
        let font = self.font.clone();
        draw_glyphs(&font, style.size() as f32, text, |x, y, coverage| {
            let (x, y) = transform.transform(x + dx - min_x, y + dy - min_y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if result.is_ok() && x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                let color = BackendColor { alpha: color.alpha * f64::from(coverage), rgb: color.rgb };
                result = self.inner.draw_pixel((x, y), color);
            }
        });
        result
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The columns with ink of `text` at `size`, as runs of consecutive columns.
    fn ink_runs(text: &str, size: f32) -> usize {
        let font = FontRef::try_from_slice(crate::render::FONT).unwrap();
        let mut columns = std::collections::BTreeSet::new();
        draw_glyphs(&font, size, text, |x, _, coverage| {
            if coverage > 0.3 {
                columns.insert(x);
            }
        });
        let columns: Vec<i32> = columns.into_iter().collect();
        1 + columns.windows(2).filter(|w| w[1] > w[0] + 1).count()
    }

    /// At legend size "cl" is two separate glyphs, not one "d" (issue 35: "nccl-tests" read
    /// "ncd-tests" in PNG charts), and "ll" too.
    #[test]
    fn neighbouring_glyphs_keep_their_gap() {
        for size in [12.0, 13.0, 15.0] {
            assert_eq!(ink_runs("cl", size), 2, "cl at {size} px");
            assert_eq!(ink_runs("ll", size), 2, "ll at {size} px");
            assert_eq!(ink_runs("ccl", size), 3, "ccl at {size} px");
        }
    }

    /// The RGB pixels of a PNG that [`crate::png::encode`] wrote (8-bit RGB, not interlaced),
    /// decoded independently of it: chunks, inflate, the five row filters.
    fn decode_png(png: &[u8]) -> (usize, usize, Vec<u8>) {
        use std::io::Read;
        assert_eq!(png[..8], crate::png::SIGNATURE);
        let (mut width, mut height, mut data) = (0, 0, Vec::new());
        let mut at = 8;
        while at + 8 <= png.len() {
            let length = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let (kind, body) = (&png[at + 4..at + 8], &png[at + 8..at + 8 + length]);
            match kind {
                b"IHDR" => {
                    width = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
                    height = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
                    assert_eq!(body[8..13], [8, 2, 0, 0, 0], "8-bit RGB, not interlaced");
                }
                b"IDAT" => data.extend_from_slice(body),
                _ => {}
            }
            at += 12 + length;
        }
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&data[..]).read_to_end(&mut raw).unwrap();
        let stride = width * 3;
        assert_eq!(raw.len(), height * (stride + 1));
        let mut pixels: Vec<u8> = Vec::with_capacity(height * stride);
        for (y, row) in raw.chunks(stride + 1).enumerate() {
            for (i, &byte) in row[1..].iter().enumerate() {
                let left = if i >= 3 { i32::from(pixels[y * stride + i - 3]) } else { 0 };
                let up = if y > 0 { i32::from(pixels[(y - 1) * stride + i]) } else { 0 };
                let corner = if y > 0 && i >= 3 { i32::from(pixels[(y - 1) * stride + i - 3]) } else { 0 };
                let predicted = match row[0] {
                    0 => 0,
                    1 => left,
                    2 => up,
                    3 => (left + up) / 2,
                    4 => {
                        let p = left + up - corner;
                        let (a, b, c) = ((p - left).abs(), (p - up).abs(), (p - corner).abs());
                        if a <= b && a <= c {
                            left
                        } else if b <= c {
                            up
                        } else {
                            corner
                        }
                    }
                    filter => panic!("row {y}: filter type {filter}"),
                };
                pixels.push(byte.wrapping_add(predicted as u8));
            }
        }
        (width, height, pixels)
    }

    /// The gaps, in ink-free pixel columns, between the glyphs of `text` drawn in black at `size`
    /// px on a PNG chart's canvas (the path every chart takes, [`crate::render::png`]), read back
    /// from the encoded file: ink is a pixel at least 30% covered. One entry per gap, so `n`
    /// glyphs that keep apart give `n - 1` gaps of at least one column.
    fn png_gaps(text: &str, size: u32) -> Vec<usize> {
        use plotters::prelude::*;
        let canvas = crate::render::Size { width: 160, height: 40 };
        let png = crate::render::png(canvas, |area| {
            let style = TextStyle::from((crate::render::FAMILY, size).into_font()).color(&BLACK);
            area.draw_text(text, &style, (10, 10)).map_err(crate::render::draw_error)
        })
        .unwrap();
        let (width, height, pixels) = decode_png(&png);
        let inked: Vec<bool> =
            (0..width).map(|x| (0..height).any(|y| pixels[(y * width + x) * 3] < 178)).collect();
        let first = inked.iter().position(|&i| i).expect("the text left no ink");
        let last = inked.iter().rposition(|&i| i).unwrap();
        let mut gaps = Vec::new();
        let mut blank = 0;
        for &ink in &inked[first..=last] {
            match (ink, blank) {
                (true, 0) => {}
                (true, _) => {
                    gaps.push(blank);
                    blank = 0;
                }
                (false, _) => blank += 1,
            }
        }
        gaps
    }

    /// The same on the PNG itself: a chart's legend text ("nccl-tests" at the legend's 14 px and
    /// around it) keeps a blank column between "c" and "l" and between the two "l"s of "cll".
    /// plotters' own bitmap text (the old path) joins them ("ncd-tests").
    #[test]
    fn png_charts_keep_a_blank_column_between_neighbouring_glyphs() {
        crate::render::register_font();
        for size in [12, 13, 14, 15] {
            for (text, glyphs) in [("cl", 2), ("ll", 2), ("ccl", 3), ("cll", 3)] {
                let gaps = png_gaps(text, size);
                assert_eq!(gaps.len(), glyphs - 1, "{text} at {size} px: gaps {gaps:?}");
            }
        }
    }
}
