package admin

import (
	"fmt"
	"time"

	"github.com/greyrelay/greyrelay/relay/metrics"
)

// The status page's charts: recipients delivered, deferred and bounced
// per minute over the last hours, from metrics.Recent, as inline SVG bars
// (one per minute, scaled to the chart's busiest minute). No script and
// no library: the page stays one self-contained document that the
// Content-Security-Policy keeps inert.

// chartMinutes is the span of a chart; chartHeight its height in pixels
// (one pixel of width per minute).
const (
	chartMinutes = metrics.RecentMinutes
	chartHeight  = 48
)

type chartBar struct{ X, Y, H int }

type pageChart struct {
	ID, Title, Color string
	Total, Peak      int
	Bars             []chartBar // minutes without outcomes have none
	Width, Height    int
	Label            string // for screen readers and the tooltip
}

// chartColors are the bar colours: the test of the page in a browser
// finds them in its screenshot.
var chartKinds = []struct {
	id, title, color string
	class            int
}{
	{"delivered", "Delivered", "#2e7d32", metrics.RecentDelivered},
	{"deferred", "Deferred", "#ef6c00", metrics.RecentDeferred},
	{"bounced", "Bounced", "#c62828", metrics.RecentBounced},
}

func charts(r *metrics.Recent, now time.Time) []pageChart {
	out := make([]pageChart, 0, len(chartKinds))
	for _, k := range chartKinds {
		series := r.Series(k.class, now, chartMinutes)
		c := pageChart{ID: k.id, Title: k.title, Color: k.color, Width: chartMinutes, Height: chartHeight}
		for _, n := range series {
			c.Total += n
			c.Peak = max(c.Peak, n)
		}
		for i, n := range series {
			if n == 0 {
				continue
			}
			h := max(1, n*chartHeight/c.Peak) // a single outcome stays visible
			c.Bars = append(c.Bars, chartBar{X: i, Y: chartHeight - h, H: h})
		}
		c.Label = fmt.Sprintf("%s per minute over the last %d hours: %d in all, at most %d in one minute",
			k.title, chartMinutes/60, c.Total, c.Peak)
		out = append(out, c)
	}
	return out
}
