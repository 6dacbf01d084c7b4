package admin

import (
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
)

// queueCollector exposes the queue's state as gauges computed at scrape
// time. queue.Stats keeps its counts in memory, so a scrape costs one short
// read transaction (the oldest message) and a stat of the file, never a scan.
//
// The queue counts recipients by status and, separately, live recipients
// by reason; it has no joint count. So the two are two metrics rather than
// one metric with both labels, where summing would count recipients twice.
// Label values come from closed sets (statuses, classifier reasons).
type queueCollector struct {
	q   *queue.Queue
	now func() time.Time

	recipients *prometheus.Desc
	byReason   *prometheus.Desc
	messages   *prometheus.Desc
	oldestAge  *prometheus.Desc
	dbBytes    *prometheus.Desc
	unsettled  *prometheus.Desc
}

func newQueueCollector(q *queue.Queue, now func() time.Time) *queueCollector {
	return &queueCollector{q: q, now: now,
		recipients: prometheus.NewDesc("greyrelay_queue_recipients",
			"Recipients in the queue, by status.", []string{"status"}, nil),
		byReason: prometheus.NewDesc("greyrelay_queue_recipients_by_reason",
			"Live (not final) recipients in the queue whose last attempt was classified, by reason (greylisted, rate-limited, ...).",
			[]string{"reason"}, nil),
		messages: prometheus.NewDesc("greyrelay_queue_messages",
			"Messages in the queue.", nil, nil),
		oldestAge: prometheus.NewDesc("greyrelay_queue_oldest_age_seconds",
			"Age of the oldest message in the queue (0 when empty).", nil, nil),
		dbBytes: prometheus.NewDesc("greyrelay_queue_db_bytes",
			"Size of the queue database file; bbolt files never shrink.", nil, nil),
		unsettled: prometheus.NewDesc("greyrelay_queue_unsettled_recipients",
			"Recipients accepted (safe in the intake journal) that the queue database could not take yet, e.g. on a full disk; not in the other queue gauges.",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.recipients
	ch <- c.byReason
	ch <- c.messages
	ch <- c.oldestAge
	ch <- c.dbBytes
	ch <- c.unsettled
}

// Collect implements prometheus.Collector. When the queue cannot be read
// it reports an invalid metric, which makes the scrape show the error
// instead of silently reporting an empty queue. When the database cannot
// take the accepted messages (a full disk), the gauges show what it holds
// and greyrelay_queue_unsettled_recipients what it lacks: the scrape that
// an alert on a full disk depends on keeps working.
func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.dbBytes, prometheus.GaugeValue, float64(c.q.DBSize()))
	st, err := c.q.Stats()
	unsettled, err := unsettledOf(err)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.messages, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.unsettled, prometheus.GaugeValue, float64(unsettled.Recipients))
	// Every known status is always exported, so a status that drops to zero
	// reads 0 rather than disappearing.
	for _, s := range statuses() {
		ch <- prometheus.MustNewConstMetric(c.recipients, prometheus.GaugeValue, float64(st.ByStatus[s]), string(s))
	}
	for _, reason := range reasons(st.ByReason) {
		ch <- prometheus.MustNewConstMetric(c.byReason, prometheus.GaugeValue, float64(st.ByReason[reason]), reason)
	}
	ch <- prometheus.MustNewConstMetric(c.messages, prometheus.GaugeValue, float64(st.Messages))
	age := 0.0
	if !st.Oldest.IsZero() {
		age = max(0, c.now().Sub(st.Oldest).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.oldestAge, prometheus.GaugeValue, age)
}

// statuses lists the recipient states in lifecycle order.
func statuses() []queue.Status {
	return []queue.Status{queue.Queued, queue.Deferred, queue.Active, queue.Held,
		queue.Delivered, queue.Relayed, queue.Failed}
}

// reasons returns every classifier reason in its fixed order, then any
// other reason present in counts (an operator rule's), sorted.
func reasons(counts map[string]int) []string {
	var out []string
	known := map[string]bool{}
	for _, r := range classifier.Reasons() {
		out = append(out, string(r))
		known[string(r)] = true
	}
	var extra []string
	for r := range counts {
		if !known[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(extra)
	return append(out, extra...)
}
