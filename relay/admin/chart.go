package admin

import (
	"fmt"
	"time"

	"github.com/greyrelay/greyrelay/relay/metrics"
)

// The status page's charts: recipients delivered, deferred and bounced
// per minute, from metrics.Recent, as inline SVG bars scaled to the
// chart's busiest minute. No script and no library: the page stays one
// self-contained document that the Content-Security-Policy keeps inert.
//
// A chart spans the last hour, or the last 3 or 6 hours when its oldest
// outcome is older, so that a new relay's first minutes are bars as wide
// as the span allows rather than a one-pixel line at the edge of six
// hours. The daemon stores the series in the queue database, so a
// restart keeps them; a line marks when this process started.

// chartWidth and chartHeight are a chart's drawing size (its viewBox; the
// page scales it to the width it has).
const (
	chartWidth  = 360
	chartHeight = 48
)

// chartSpans are the spans a chart may have, in minutes, shortest first;
// the last is all metrics.Recent remembers.
var chartSpans = []int{60, 3 * 60, metrics.RecentMinutes}

type chartBar struct{ X, Y, W, H int }

type pageChart struct {
	ID, Title, Color string
	Total, Peak      int
	Bars             []chartBar // minutes without outcomes have none
	Label            string     // for screen readers and the tooltip
}

// chartAxis is what the charts share: their span and time axis.
type chartAxis struct {
	Span      string   // "hour", "3 hours"
	Ticks     []string // clock times (UTC) below the charts: start, middle, now
	Grid      []int    // x of the quarter lines
	Started   int      // x of this process's start, -1 when outside the span
	StartedAt string
	Width     int
	Height    int
	Empty     bool // no outcome in the span
}

// chartKinds are the charts and their bar colours: the test of the page
// in a browser finds them in its screenshot.
var chartKinds = []struct {
	id, title, color string
	class            int
}{
	{"delivered", "Delivered", "#2e7d32", metrics.RecentDelivered},
	{"deferred", "Deferred", "#ef6c00", metrics.RecentDeferred},
	{"bounced", "Bounced", "#c62828", metrics.RecentBounced},
}

// chartSpan returns the shortest span that reaches back to first (the
// oldest outcome; zero: none).
func chartSpan(first, now time.Time) int {
	for _, span := range chartSpans {
		if first.IsZero() || now.Sub(first) < time.Duration(span)*time.Minute {
			return span
		}
	}
	return chartSpans[len(chartSpans)-1]
}

func charts(r *metrics.Recent, now, started time.Time) ([]pageChart, chartAxis) {
	span := chartSpan(r.First(now), now)
	bw := chartWidth / span // minutes are whole pixels wide
	ax := chartAxis{Width: chartWidth, Height: chartHeight, Started: -1, Empty: true}
	ax.Span = "hour"
	if span > 60 {
		ax.Span = fmt.Sprintf("%d hours", span/60)
	}
	begin := now.Truncate(time.Minute).Add(-time.Duration(span-1) * time.Minute)
	for i := range 3 {
		ax.Ticks = append(ax.Ticks, begin.Add(time.Duration(i*span/2)*time.Minute).UTC().Format("15:04"))
	}
	ax.Ticks[2] = "now " + now.UTC().Format("15:04") + " UTC"
	for i := 1; i < 4; i++ {
		ax.Grid = append(ax.Grid, i*chartWidth/4)
	}
	if !started.Before(begin) && !started.After(now) {
		ax.Started = int(started.Sub(begin)/time.Minute) * bw
		ax.StartedAt = started.UTC().Format("15:04")
	}
	out := make([]pageChart, 0, len(chartKinds))
	for _, k := range chartKinds {
		series := r.Series(k.class, now, span)
		c := pageChart{ID: k.id, Title: k.title, Color: k.color}
		for _, n := range series {
			c.Total += n
			c.Peak = max(c.Peak, n)
		}
		for i, n := range series {
			if n == 0 {
				continue
			}
			h := max(2, n*chartHeight/c.Peak) // a single outcome stays visible
			c.Bars = append(c.Bars, chartBar{X: i * bw, Y: chartHeight - h, W: max(1, bw-bw/4), H: h})
		}
		if c.Total > 0 {
			ax.Empty = false
		}
		c.Label = fmt.Sprintf("%s per minute over the last %s: %d in all, at most %d in one minute",
			k.title, ax.Span, c.Total, c.Peak)
		out = append(out, c)
	}
	return out, ax
}
