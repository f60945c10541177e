//! Line charts with the `plotters` crate, written as PNG and SVG side by side: the one look
//! of every plot murmur draws (a run folder's `plots/`, `murmur plot`, the experiment
//! drivers).
//!
//! Text needs a TrueType font, read at run time so that no font is committed: the file
//! named by `MURMUR_FONT`, else the first of [`FONT_PATHS`] that exists (DejaVu Sans, the
//! Debian package `fonts-dejavu-core`). Without one, [`init_fonts`] says what to install.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Where a chart's legend goes.
pub use plotters::chart::SeriesLabelPosition;

/// Where [`init_fonts`] looks for a sans-serif TrueType font, in order.
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
];

/// The font family name the charts ask for.
const FAMILY: &str = "sans-serif";

/// Registers the font for chart text (once per process).
///
/// # Errors
/// No readable font (see the module doc), or a file that is not a TrueType/OpenType font.
pub fn init_fonts() -> anyhow::Result<()> {
    let path = match std::env::var_os("MURMUR_FONT") {
        Some(p) => PathBuf::from(p),
        None => FONT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                anyhow!(
                    "no TrueType font for the plots: install DejaVu Sans (Debian/Ubuntu: \
                     `apt-get install fonts-dejavu-core`) or set MURMUR_FONT=/path/to/font.ttf"
                )
            })?,
    };
    let bytes = std::fs::read(&path).with_context(|| format!("reading font {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a TrueType/OpenType font", path.display()))?;
    Ok(())
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stroke {
    /// A solid line.
    Solid,
    /// A dashed line (theory, predictions).
    Dashed,
    /// Markers only, no line.
    Points,
}

/// One curve: `points` are (x, y); `band`, if any, is (x, low, high) drawn as a shaded
/// area of the same colour (spread over seeds).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) in data units, any order of x is drawn as given.
    pub points: Vec<(f64, f64)>,
    /// (x, low, high), or empty.
    pub band: Vec<(f64, f64, f64)>,
    /// Line style.
    pub stroke: Stroke,
    /// Index into the palette; series with the same colour index share a colour.
    pub color: usize,
}

impl Series {
    /// A solid line with the colour `color`.
    pub fn line(label: impl Into<String>, color: usize, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.into(),
            points,
            band: Vec::new(),
            stroke: Stroke::Solid,
            color,
        }
    }

    /// The same series with another stroke.
    pub fn stroke(mut self, stroke: Stroke) -> Self {
        self.stroke = stroke;
        self
    }

    /// The same series with a spread band (x, low, high).
    pub fn band(mut self, band: Vec<(f64, f64, f64)>) -> Self {
        self.band = band;
        self
    }
}

/// A chart: axes, scales and series.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title above the plot.
    pub title: String,
    /// Axis labels.
    pub x_label: String,
    /// Axis labels.
    pub y_label: String,
    /// Logarithmic x axis (points with x ≤ 0 are left out).
    pub log_x: bool,
    /// Only whole numbers are labelled on the x axis (epochs, rounds).
    pub x_integer: bool,
    /// Logarithmic y axis (points with y below `y_floor` are left out).
    pub log_y: bool,
    /// Smallest y drawn on a log axis.
    pub y_floor: f64,
    /// Fixed y range, else fitted to the data; points outside it are left out.
    pub y_range: Option<(f64, f64)>,
    /// The curves.
    pub series: Vec<Series>,
    /// Where the legend goes (the corner the curves leave empty).
    pub legend: SeriesLabelPosition,
}

impl Chart {
    /// An empty linear chart.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        Chart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            log_x: false,
            x_integer: false,
            log_y: false,
            y_floor: 1e-12,
            y_range: None,
            series: Vec::new(),
            legend: SeriesLabelPosition::UpperRight,
        }
    }

    /// Writes `<stem>.png` (1000×650) and `<stem>.svg` and checks that both exist and are
    /// not empty (the `--quick` check of a plot); returns both paths.
    ///
    /// # Errors
    /// No point to draw, or a file that cannot be written.
    pub fn save(&self, stem: &Path) -> anyhow::Result<[PathBuf; 2]> {
        self.check_text()?;
        let png = stem.with_extension("png");
        let svg = stem.with_extension("svg");
        {
            let root = BitMapBackend::new(&png, (1000, 650)).into_drawing_area();
            self.draw(&root)
                .with_context(|| format!("drawing {}", png.display()))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", png.display()))?;
        }
        {
            let root = SVGBackend::new(&svg, (1000, 650)).into_drawing_area();
            self.draw(&root)
                .with_context(|| format!("drawing {}", svg.display()))?;
            root.present()
                .map_err(|e| anyhow!("writing {}: {e}", svg.display()))?;
        }
        for f in [&png, &svg] {
            let len = std::fs::metadata(f)
                .with_context(|| format!("plot {} was not written", f.display()))?
                .len();
            if len == 0 {
                bail!("plot {} is empty", f.display());
            }
        }
        Ok([png, svg])
    }

    /// Refuses text with a combining mark (U+0300–U+036F, as in "x̄" = x + U+0304): the
    /// font renderer draws the mark beside its letter ("x¯"), so a label must say it in
    /// words ("averaged model").
    fn check_text(&self) -> anyhow::Result<()> {
        let texts = [&self.title, &self.x_label, &self.y_label]
            .into_iter()
            .chain(self.series.iter().map(|s| &s.label));
        for t in texts {
            if t.chars().any(|c| ('\u{300}'..='\u{36f}').contains(&c)) {
                bail!("chart text {t:?} has a combining mark, which the plots cannot draw");
            }
        }
        Ok(())
    }

    /// Whether a point can be drawn on this chart's axes.
    fn drawable(&self, x: f64, y: f64) -> bool {
        x.is_finite()
            && y.is_finite()
            && (!self.log_x || x > 0.0)
            && (!self.log_y || y >= self.y_floor)
            && self.y_range.is_none_or(|(lo, hi)| (lo..=hi).contains(&y))
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let pts: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| {
                s.points
                    .iter()
                    .copied()
                    .chain(s.band.iter().flat_map(|&(x, lo, hi)| [(x, lo), (x, hi)]))
            })
            .filter(|&(x, y)| self.drawable(x, y))
            .collect();
        if pts.is_empty() {
            bail!("chart {:?} has no drawable point", self.title);
        }
        let (mut x0, mut x1) = min_max(pts.iter().map(|p| p.0));
        let (mut y0, mut y1) = self
            .y_range
            .unwrap_or_else(|| min_max(pts.iter().map(|p| p.1)));
        if x1 <= x0 {
            (x0, x1) = widen(x0, self.log_x);
        }
        if y1 <= y0 {
            (y0, y1) = widen(y0, self.log_y);
        }
        if !self.log_y && self.y_range.is_none() {
            let pad = 0.04 * (y1 - y0);
            (y0, y1) = (y0 - pad, y1 + pad);
        }
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let mut builder = ChartBuilder::on(root);
        builder
            .caption(&self.title, (FAMILY, 21))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(80);
        match (self.log_x, self.log_y) {
            (false, false) => {
                let c = builder
                    .build_cartesian_2d(x0..x1, y0..y1)
                    .map_err(|e| anyhow!("{e}"))?;
                self.fill(c)
            }
            (false, true) => {
                let c = builder
                    .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
                    .map_err(|e| anyhow!("{e}"))?;
                self.fill(c)
            }
            (true, false) => {
                let c = builder
                    .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                    .map_err(|e| anyhow!("{e}"))?;
                self.fill(c)
            }
            (true, true) => {
                let c = builder
                    .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                    .map_err(|e| anyhow!("{e}"))?;
                self.fill(c)
            }
        }
    }

    /// Mesh, bands, lines and legend on a built chart.
    fn fill<'a, DB, X, Y>(
        &self,
        mut chart: ChartContext<'a, DB, Cartesian2d<X, Y>>,
    ) -> anyhow::Result<()>
    where
        DB: DrawingBackend + 'a,
        DB::ErrorType: 'static,
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
        let (log_x, log_y) = (self.log_x, self.log_y);
        let x_integer = self.x_integer;
        let fx = move |v: &f64| {
            if x_integer && v.fract() != 0.0 {
                String::new()
            } else {
                tick(*v, log_x)
            }
        };
        let fy = move |v: &f64| tick(*v, log_y);
        chart
            .configure_mesh()
            .x_label_formatter(&fx)
            .y_label_formatter(&fy)
            .x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .label_style((FAMILY, 16))
            .axis_desc_style((FAMILY, 18))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(e)?;
        for s in &self.series {
            let color = palette(s.color);
            let band: Vec<(f64, f64, f64)> = s
                .band
                .iter()
                .copied()
                .filter(|&(x, lo, hi)| self.drawable(x, lo) && self.drawable(x, hi))
                .collect();
            if band.len() >= 2 {
                let outline: Vec<(f64, f64)> = band
                    .iter()
                    .map(|&(x, lo, _)| (x, lo))
                    .chain(band.iter().rev().map(|&(x, _, hi)| (x, hi)))
                    .collect();
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        outline,
                        color.mix(0.18).filled(),
                    )))
                    .map_err(e)?;
            }
        }
        for s in &self.series {
            let color = palette(s.color);
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| self.drawable(x, y))
                .collect();
            let style = color.stroke_width(2);
            let anno = match s.stroke {
                Stroke::Solid => chart.draw_series(LineSeries::new(pts, style)).map_err(e)?,
                Stroke::Dashed => chart
                    .draw_series(DashedLineSeries::new(pts, 8, 5, style))
                    .map_err(e)?,
                Stroke::Points => chart
                    .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                    .map_err(e)?,
            };
            // The legend's swatch has the series' stroke: a short dash, a line, or a dot
            // (a short thick segment) for markers.
            let (from, to, width) = match s.stroke {
                Stroke::Dashed => (0, 7, 2),
                Stroke::Solid => (0, 18, 2),
                Stroke::Points => (6, 12, 6),
            };
            anno.label(s.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x + from, y), (x + to, y)], color.stroke_width(width))
            });
        }
        chart
            .configure_series_labels()
            .label_font((FAMILY, 15))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .position(self.legend.clone())
            .draw()
            .map_err(e)?;
        Ok(())
    }
}

/// Ten distinguishable colours (the Tableau 10 palette), then repeating.
fn palette(i: usize) -> RGBColor {
    const C: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = C[i % C.len()];
    RGBColor(r, g, b)
}

/// A tick label: on a log axis only 1, 2 and 5 × 10^k are labelled (the other grid lines
/// stay unlabelled), as `1e-6` below 10⁻³ or from 10⁵ on; on a linear axis the shortest
/// decimal form.
fn tick(v: f64, log: bool) -> String {
    if log {
        if v <= 0.0 {
            return String::new();
        }
        let e = v.log10().floor();
        let m = v / 10f64.powf(e);
        let lead = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .find(|l| (m - l).abs() < 0.02 * l);
        let Some(lead) = lead else {
            return String::new();
        };
        let (lead, e) = if lead == 10.0 {
            (1.0, e + 1.0)
        } else {
            (lead, e)
        };
        return if !(-3.0..5.0).contains(&e) {
            format!("{lead}e{e}")
        } else {
            trim(lead * 10f64.powf(e))
        };
    }
    trim(v)
}

/// `v` with at most 4 significant decimals and no trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{:.4}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

fn min_max(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    })
}

/// A non-empty range around the single value `v`.
fn widen(v: f64, log: bool) -> (f64, f64) {
    if log {
        (v / 2.0, v * 2.0)
    } else if v == 0.0 {
        (-1.0, 1.0)
    } else {
        (v - 0.5 * v.abs(), v + 0.5 * v.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels() {
        assert_eq!(tick(1e-6, true), "1e-6");
        assert_eq!(tick(2e-3, true), "0.002");
        assert_eq!(tick(5e5, true), "5e5");
        assert_eq!(tick(0.999_999_999_8e-4, true), "1e-4");
        assert_eq!(tick(3e-2, true), "");
        assert_eq!(tick(20.0, true), "20");
        assert_eq!(tick(0.25, false), "0.25");
        assert_eq!(tick(40.0, false), "40");
    }

    #[test]
    fn a_log_chart_with_bands_and_theory_is_written_in_both_formats() {
        init_fonts().unwrap();
        let dir = std::env::temp_dir().join(format!("murmur-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = Chart::new("test", "round", "Ξ²/Ξ²(0)");
        c.log_y = true;
        let pts: Vec<(f64, f64)> = (0..50).map(|t| (t as f64, 0.9f64.powi(2 * t))).collect();
        let band = pts.iter().map(|&(x, y)| (x, 0.8 * y, 1.2 * y)).collect();
        c.series
            .push(Series::line("measured", 0, pts.clone()).band(band));
        c.series
            .push(Series::line("theory", 0, pts).stroke(Stroke::Dashed));
        c.series
            .push(Series::line("zero", 1, vec![(0.0, 1.0), (1.0, 0.0)]).stroke(Stroke::Points));
        let [png, svg] = c.save(&dir.join("chart")).unwrap();
        // A PNG signature and an SVG with the legend text.
        assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("measured") && text.contains("theory"));
        let empty = Chart::new("empty", "x", "y");
        assert!(empty.save(&dir.join("empty")).is_err());
        let mut combining = Chart::new("accuracy of x\u{304}", "x", "y");
        combining
            .series
            .push(Series::line("a", 0, vec![(0.0, 1.0)]));
        let err = combining.save(&dir.join("combining")).unwrap_err();
        assert!(err.to_string().contains("combining mark"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
