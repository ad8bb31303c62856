package replay

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// WritePlot draws hit ratio against capacity (percent of distinct blocks,
// log scale) for each policy, Belady's optimum and the unlimited-capacity
// line, and saves it to path; the extension (.png, .svg, .pdf) picks the
// format.
func (sw *Sweep) WritePlot(path, title string) error {
	if len(sw.Points) == 0 {
		return fmt.Errorf("%w: nothing to plot", ErrBadConfig)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "capacity (% of distinct blocks)"
	p.Y.Label.Text = "prefix hit ratio (% of prompt blocks)"
	p.X.Scale = plot.LogScale{}
	ticks := make([]plot.Tick, len(sw.Points))
	for i, pt := range sw.Points {
		ticks[i] = plot.Tick{Value: 100 * pt.Fraction, Label: strconv.FormatFloat(100*pt.Fraction, 'g', 3, 64)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Room at both ends, so the first and last ticks' labels are not cut.
	lo, hi := 100*sw.Points[0].Fraction, 100*sw.Points[len(sw.Points)-1].Fraction
	p.X.Min, p.X.Max = lo/1.25, hi*1.25
	p.Y.Min = 0
	p.Title.Padding = vg.Points(6)
	// The legend goes right of the plot area, off the curves.
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.XOffs = vg.Points(0)
	p.Legend.ThumbnailWidth = vg.Points(20)
	p.Add(plotter.NewGrid())

	line := func(name string, pts plotter.XYs, c color.Color, dashed bool, shape draw.GlyphDrawer) error {
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, s.Color, s.Shape = c, c, shape
		l.Width = vg.Points(1.5)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l, s)
		p.Legend.Add(name, l, s)
		return nil
	}
	palette := []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255},
		color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 255}, color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 255},
		color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 255}, color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 255},
	}
	shapes := []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}, draw.CrossGlyph{}, draw.PlusGlyph{}}
	// One line per run of a capacity: each policy, then each policy
	// with hints (dashed, one colour per accuracy's run).
	for i, r := range sw.Points[0].Results {
		pts := make(plotter.XYs, len(sw.Points))
		for k, pt := range sw.Points {
			pts[k] = plotter.XY{X: 100 * pt.Fraction, Y: 100 * pt.Results[i].HitRatio()}
		}
		if err := line(r.Label(), pts, palette[i%len(palette)], r.HintAccuracy > 0, shapes[i%len(shapes)]); err != nil {
			return err
		}
	}
	bel := make(plotter.XYs, len(sw.Points))
	unl := make(plotter.XYs, len(sw.Points))
	for k, pt := range sw.Points {
		bel[k] = plotter.XY{X: 100 * pt.Fraction, Y: 100 * ratio(pt.BeladyHits, pt.Results[0].Blocks)}
		unl[k] = plotter.XY{X: 100 * pt.Fraction, Y: 100 * ratio(sw.UnlimitedHits, sw.Blocks)}
	}
	if err := line("belady", bel, color.Black, true, draw.RingGlyph{}); err != nil {
		return err
	}
	if err := line("unlimited", unl, color.Gray{Y: 0x80}, true, draw.BoxGlyph{}); err != nil {
		return err
	}
	// The legend is drawn in a column of its own right of the plot.
	format := strings.TrimPrefix(filepath.Ext(path), ".")
	img, err := draw.NewFormattedCanvas(8*vg.Inch, 4.5*vg.Inch, format)
	if err != nil {
		return err
	}
	c := draw.New(img)
	legendW := 2.1 * vg.Inch
	plotArea := draw.Canvas{Canvas: c, Rectangle: vg.Rectangle{Min: c.Min, Max: vg.Point{X: c.Max.X - legendW, Y: c.Max.Y - vg.Points(4)}}}
	p.Legend.Top, p.Legend.Left = true, false
	legend := p.Legend
	p.Legend = plot.NewLegend()
	p.Draw(plotArea)
	legendArea := draw.Canvas{Canvas: c, Rectangle: vg.Rectangle{Min: vg.Point{X: c.Max.X - legendW, Y: c.Min.Y}, Max: vg.Point{X: c.Max.X - vg.Points(6), Y: c.Max.Y - vg.Points(40)}}}
	legend.Draw(legendArea)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
