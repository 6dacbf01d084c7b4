package metrics

import "github.com/prometheus/client_golang/prometheus"

// Events holds the delivery-event collectors (relay/events), labelled by
// sink: a configured webhook's URL without query or credentials, or "file"
// for the event file; a closed set taken from the configuration.
type Events struct {
	Pending *prometheus.GaugeVec   // events stored, not yet passed on
	Sent    *prometheus.CounterVec // events passed on (acknowledged by a webhook, written to the file)
	Failed  *prometheus.CounterVec // failed POSTs or writes (each retried later)
	Dropped *prometheus.CounterVec // events dropped undelivered after events.max_age
}

// NewEvents creates the event collectors and registers them on reg.
func NewEvents(reg prometheus.Registerer) *Events {
	m := &Events{
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "greyrelay_events_pending", Help: "Delivery events stored for a sink and not yet passed on."}, []string{"webhook"}),
		Sent:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "greyrelay_events_sent_total", Help: "Delivery events passed on to a sink (acknowledged by the webhook, written to the file)."}, []string{"webhook"}),
		Failed:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "greyrelay_events_failed_total", Help: "Failed deliveries of a batch of events to a sink; each is retried with backoff."}, []string{"webhook"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "greyrelay_events_dropped_total", Help: "Delivery events dropped undelivered because they were older than events.max_age."}, []string{"webhook"}),
	}
	reg.MustRegister(m.Pending, m.Sent, m.Failed, m.Dropped)
	return m
}
