//! Pictures: the metaslab map of a pool (`zeta pool map`) and the charts of `zeta bench frag`,
//! drawn with `plotters` as SVG or PNG by the file's extension.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use zeta_core::dsl::PoolMap;

/// The kinds of file a picture can be written as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The format `path`'s extension names, or an error saying which ones are known.
    pub fn of(path: &Path) -> Result<Format, String> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase())
        {
            Some(e) if e == "svg" => Ok(Format::Svg),
            Some(e) if e == "png" => Ok(Format::Png),
            _ => Err(format!(
                "{}: a picture is written as .svg or .png (by the file's extension)",
                path.display()
            )),
        }
    }
}

/// Something drawn on any backend.
trait Picture {
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Draws `pic`, written to `path` in the format of its extension.
fn render(path: &Path, pic: &impl Picture) -> Result<(), String> {
    let format = Format::of(path)?;
    let fail = |e: String| format!("{}: {e}", path.display());
    match format {
        Format::Svg => {
            let root = SVGBackend::new(path, pic.size()).into_drawing_area();
            pic.draw(&root).map_err(fail)?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        Format::Png => {
            let root = BitMapBackend::new(path, pic.size()).into_drawing_area();
            // A PNG's text is drawn from a system font (an SVG names the font and leaves the
            // drawing to its viewer).
            pic.draw(&root).map_err(|e| {
                if e.contains("Font") {
                    fail(format!(
                        "{e}: a PNG needs a sans-serif font found through fontconfig \
                         (Debian: fonts-dejavu-core); an .svg needs none"
                    ))
                } else {
                    fail(e)
                }
            })?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Cells in a row of the map.
const MAP_COLUMNS: usize = 20;
const CELL: (i32, i32) = (56, 40);
const HEADING: i32 = 28;

/// The colour of a metaslab `free_pct` free: red when full, through yellow, to green when
/// wholly free, as the seed's figures grade them.
fn free_colour(free_pct: f64) -> RGBColor {
    let f = (free_pct / 100.0).clamp(0.0, 1.0);
    let (r, g) = if f < 0.5 {
        (220.0, 60.0 + 340.0 * f)
    } else {
        (220.0 - 300.0 * (f - 0.5), 230.0)
    };
    RGBColor(r as u8, g as u8, 90)
}

/// Draws every metaslab of every data vdev as a cell coloured by its free percentage and
/// labelled with it and its fragmentation, under `title`.
pub fn draw_map(map: &PoolMap, title: &str, path: &Path) -> Result<(), String> {
    render(path, &MapPicture { map, title })
}

struct MapPicture<'a> {
    map: &'a PoolMap,
    title: &'a str,
}

impl Picture for MapPicture<'_> {
    fn size(&self) -> (u32, u32) {
        let rows: i32 = self
            .map
            .vdevs
            .iter()
            .map(|v| v.metaslabs.len().div_ceil(MAP_COLUMNS) as i32)
            .sum();
        let h = HEADING * (1 + self.map.vdevs.len() as i32) + rows * CELL.1 + 16;
        ((MAP_COLUMNS as i32 * CELL.0 + 16) as u32, h as u32)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        map_on(root, self.map, self.title)
    }
}

fn map_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    map: &PoolMap,
    title: &str,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let big = ("sans-serif", 16).into_font();
    let small = ("sans-serif", 12).into_font();
    let tiny = ("sans-serif", 10).into_font();
    let pct = |part: u64, of: u64| {
        if of == 0 {
            0.0
        } else {
            part as f64 * 100.0 / of as f64
        }
    };
    let freeing: u64 = map
        .vdevs
        .iter()
        .flat_map(|v| &v.metaslabs)
        .map(|m| m.freeing)
        .sum();
    let heading = format!(
        "{title}: {:.0}% free, {:.0}% freeing, fragmentation {}% (cells count both as free)",
        pct(map.free, map.size),
        pct(freeing, map.size),
        map.fragmentation
    );
    root.draw(&Text::new(heading, (8, 6), big)).map_err(err)?;
    let mut y = HEADING;
    for v in &map.vdevs {
        let line = format!(
            "vdev {}: {} metaslabs, {:.0}% free, fragmentation {}% (cell: free %, f = fragmentation %)",
            v.vdev,
            v.metaslabs.len(),
            pct(v.free, v.size),
            v.fragmentation
        );
        root.draw(&Text::new(line, (8, y + 6), small.clone()))
            .map_err(err)?;
        y += HEADING;
        for (i, ms) in v.metaslabs.iter().enumerate() {
            let (col, row) = ((i % MAP_COLUMNS) as i32, (i / MAP_COLUMNS) as i32);
            let (x0, y0) = (8 + col * CELL.0, y + row * CELL.1);
            let free = pct(ms.free + ms.freeing, ms.size);
            root.draw(&Rectangle::new(
                [(x0, y0), (x0 + CELL.0 - 2, y0 + CELL.1 - 2)],
                free_colour(free).filled(),
            ))
            .map_err(err)?;
            root.draw(&Text::new(
                format!("{free:.0}%"),
                (x0 + 4, y0 + 4),
                small.clone(),
            ))
            .map_err(err)?;
            root.draw(&Text::new(
                format!("f{}", ms.fragmentation),
                (x0 + 4, y0 + 22),
                tiny.clone(),
            ))
            .map_err(err)?;
        }
        y += v.metaslabs.len().div_ceil(MAP_COLUMNS) as i32 * CELL.1;
    }
    Ok(())
}

/// One line of a chart: its name and its points.
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws `lines` on one chart with axes named `x` and `y`.
pub fn draw_lines(
    title: &str,
    x: &str,
    y: &str,
    lines: &[Line],
    path: &Path,
) -> Result<(), String> {
    render(path, &Chart { title, x, y, lines })
}

struct Chart<'a> {
    title: &'a str,
    x: &'a str,
    y: &'a str,
    lines: &'a [Line],
}

impl Picture for Chart<'_> {
    fn size(&self) -> (u32, u32) {
        (900, 540)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        lines_on(root, self.title, self.x, self.y, self.lines)
    }
}

fn lines_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    xd: &str,
    yd: &str,
    lines: &[Line],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let all = || lines.iter().flat_map(|l| l.points.iter());
    let xmax = all().map(|p| p.0).fold(1.0, f64::max);
    let xmin = all().map(|p| p.0).fold(xmax, f64::min).min(0.0);
    let ymax = all().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xmin..xmax, 0.0..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(xd)
        .y_desc(yd)
        .draw()
        .map_err(err)?;
    for (i, l) in lines.iter().enumerate() {
        let colour = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                l.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(err)?
            .label(l.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        if l.points.len() <= 12 {
            chart
                .draw_series(l.points.iter().map(|&p| Circle::new(p, 3, colour.filled())))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_the_extension_and_others_are_refused() {
        assert_eq!(Format::of(Path::new("a/b.svg")), Ok(Format::Svg));
        assert_eq!(Format::of(Path::new("b.PNG")), Ok(Format::Png));
        assert!(Format::of(Path::new("b.jpg"))
            .unwrap_err()
            .contains(".svg or .png"));
        assert!(Format::of(Path::new("b")).is_err());
    }

    #[test]
    fn full_is_red_and_free_is_green() {
        let full = free_colour(0.0);
        let free = free_colour(100.0);
        assert!(full.0 > full.1, "{full:?}");
        assert!(free.1 > free.0, "{free:?}");
    }
}
