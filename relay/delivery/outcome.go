package delivery

import (
	"maps"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/backoff"
	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/internal/smtpvocab"
	"github.com/greyrelay/greyrelay/queue"
	"github.com/greyrelay/greyrelay/relay/dsn"
)

// outcome is what one attempt did for one recipient, or what ended its
// wait without an attempt (kind).
type outcome struct {
	r     queue.Recipient    // the recipient as it was due (before Begin)
	ok    bool               // accepted
	reply smtpvocab.Reply    // the accepting reply, when ok
	v     classifier.Verdict // why not, when !ok
	kind  outcomeKind
	// why and until: a postponement's reason and new due time.
	why   *postponement
	until time.Time
	// suppressed: the failure put the address on the suppression list;
	// decided by settleAttempt, off the loop (suppress).
	suppressed bool
}

// outcomeKind says where an outcome came from. Every kind is settled by
// settleOne and reported by report, so results, DSNs, events, log lines
// and counters are written in one place whatever ended the wait.
type outcomeKind int

const (
	// attempted: an attempt's reply, or its failure to get one; a
	// deferral past the lifetime expires (also without an attempt, a.none).
	attempted outcomeKind = iota
	// bounced: the operator's bounce (Bounce), a failure with status
	// BounceStatus.
	bounced
	// postponed: moved to until without an attempt (pushMessage).
	postponed
	// opHeld, opReleased and opDeleted: the operator's hold, release
	// (due at until) and delete (Operate, operator.go).
	opHeld
	opReleased
	opDeleted
)

// attempt is the context shared by the outcomes of one transaction (or of
// one attempt that never reached a transaction).
type attempt struct {
	msg     queue.Message
	body    []byte
	t       target // where the answer came from; zero if no server answered
	tried   target // the last host tried, for the log; zero if none
	relay   bool   // the next hop relays further (smarthost): Relayed, not Delivered
	peerDSN bool   // the peer advertised DSN, so NOTIFY/ORCPT were passed on
	start   time.Time
	// refused is the destination's refusal count (dest.refused) when
	// the attempt took its start (paceGate).
	refused int
	// hostStart is the MX address whose pace the attempt took a start
	// of (hostGate).
	hostStart string
	// begun is the start of a fresh attempt (fresh.go), stored with its
	// outcomes instead of by a Begin; nil for an attempt Begun in the queue.
	begun *queue.Start
	// none: no attempt is made (the scheduler expires recipients of a
	// paused destination), so the log and the DSN name each recipient's
	// last real route (queue.Recipient's), not an empty one.
	none bool
}

// settlement collects what one attempt changes, before it is stored.
type settlement struct {
	u        queue.Update
	notices  map[dsn.Action][]dsn.Recipient
	lines    []logLine
	rated    classifier.Verdict // a rate-limit verdict seen in this attempt
	limited  bool
	success  bool
	accepted int // recipients accepted
	// greylisted counts the recipients deferred as greylisted: to the
	// slow start (grow) they are answered as accepted ones are.
	greylisted int
	expired    bool // some recipient's lifetime ran out
	// started is when the attempt's transaction started, pacedSince when
	// the destination's pace began, lastRefused when it last refused
	// (dest's fields).
	started, pacedSince, lastRefused time.Time
	othersRun                        int              // dest's: the other nodes' run before the opening
	hosts                            map[string]*host // MX hosts learned about (host.go)
}

// logLine is one recipient's log line and metric, emitted after the commit.
type logLine struct {
	r              queue.Recipient
	res            queue.Result
	outcome        string
	reason         string
	code           int
	enhanced, text string
	expired        bool
	status         string // a failure's RFC 3463 status, as its DSN reports it
	suppressed     bool   // the failure put the address on the suppression list
	kind           outcomeKind
	note           string // a postponement's log line (none if empty)
}

// pendingOutcome is a settled attempt on its way into the queue: the
// update, and what to report once it is stored.
type pendingOutcome struct {
	u       queue.Update
	d       *dest
	a       attempt // a copy: the worker's attempt moves on to other hosts
	lines   []logLine
	actions []dsn.Action
	// own: u carries d's record (d.recording counts it); the records of
	// MX hosts (host.go) may come with it or alone.
	own bool
	// wait waits for the commit of u (queue.Pending.Wait); set when u is
	// handed to the queue.
	wait func() error
	// decided is closed once the commit of u succeeded, failed for good or
	// failed and u is held (record.go).
	decided chan struct{}
}

// settleAttempt is how a worker settles the outcomes of its attempt:
// what may wait on a disk or the network happens here, on the worker's
// goroutine (the suppression list, the shared store's view of the MX
// hosts the outcome teaches about), and the rest on the loop's, which
// owns what was learned about destinations and hosts (settle). The
// worker waits for it: its attempt's body stays mapped meanwhile.
func (e *Engine) settleAttempt(d *dest, a *attempt, outs []outcome) {
	if len(outs) == 0 {
		return
	}
	addrs := []string{a.t.addrString()}
	at := e.now()
	for i, o := range outs {
		addrs = append(addrs, o.r.MXAddr)
		if o.kind == attempted && !o.ok && o.v.Outcome == classifier.Failed {
			outs[i].suppressed = e.suppress(a, o, at)
		}
	}
	views := e.hostViews(addrs...)
	e.call(func() {
		e.adoptHostViews(views)
		e.settle(d, a, outs)
	})
}

// settle turns the outcomes of one attempt into results, DSNs and what was
// learned about the destination, logs one line per recipient, and hands
// them to the queue as one update (queue.ApplyAsync) and to the recorder,
// which collects the commit (record.go): the one route of every attempt's
// outcome, fresh (fresh.go) or Begun, and of an expiry without one
// (settleNow takes the same steps for the operator's bounce and a
// postponement). The lines are logged before the update is
// handed over, so whoever sees the queue change finds the attempt in the
// log and the metrics already. It runs on the loop's goroutine (workers
// come through settleAttempt), so outcomes learn from the destination's
// and the hosts' state one at a time, and their updates reach the
// queue's writer, which commits in the order it takes them, in the order
// they were learned.
//
// The worker does not wait for the commit: its next Begin commits after
// it anyway, so a crash before that commit only means a redelivery
// (queue.Recover; a fresh attempt's recipients are still Queued), as a
// crash before a synchronous commit would. An attempt that never was (the
// scheduler expiring recipients of a paused destination) waits for its
// commit to be decided: its recipients are neither Active nor claimed, so
// a scan before that commit would find them due and expire them again.
func (e *Engine) settle(d *dest, a *attempt, outs []outcome) {
	if len(outs) == 0 {
		return
	}
	now := e.now()
	rec := cloneDest(d.rec)
	s := &settlement{notices: map[dsn.Action][]dsn.Recipient{}, started: a.start, pacedSince: d.pacedSince, lastRefused: d.lastRefused,
		othersRun: d.othersRun}
	for _, o := range outs {
		e.settleOne(s, &rec, a, o, now)
	}
	e.learnThrottle(&rec, s, now)
	e.learnHostPace(s, &rec, a.t.addrString(), now)
	if !pace(&d.rec).Paced() && pace(&rec).Paced() {
		d.pacedSince = now
	}
	if s.limited {
		d.lastRefused = now
		d.refused++
	}
	if n := s.accepted + s.greylisted; n > 0 {
		e.grow(d, n)
	}
	if s.expired {
		e.decayThrottle(&rec, s.u.Results)
	}
	pruneDead(&rec, now)
	po := &pendingOutcome{d: d, a: *a, lines: s.lines, decided: make(chan struct{})}
	po.a.body = nil // may be a mapped spool file, unmapped when runJob returns
	po.u, po.actions = e.conclude(a, s, outs, now)
	learned := !sameDest(rec, d.stored)
	if learned {
		// Stored with the outcome. d.stored is what the queue holds once
		// the updates handed over commit (hold resets it if this one
		// fails).
		rec.Updated = now
		po.u.Destinations = []queue.Destination{rec}
		d.stored = cloneDest(rec)
		d.recording++ // until the commit is decided (record.go)
	}
	// Otherwise the stored record stays as it is, so this update need not
	// be ordered with the others of d and may share their commit (the
	// queue group-commits concurrent updates). Updated thus tells when the
	// record last changed.
	e.adopt(d, rec)
	po.own = learned
	po.u.Destinations = append(po.u.Destinations, hostRecords(s, now)...)
	e.submit(po)
	if a.none {
		<-po.decided
	}
}

// settleNow settles outcomes that no attempt had and no destination
// learns from (the operator's bounce, a postponement) as settle does,
// through settleOne, conclude and report, but stores them with a
// synchronous Apply and reports them only once stored: its caller (the
// operator waiting for an answer, a scan that must not find the
// recipients due again) learns whether they were, and no log line or
// counter tells of an outcome the queue refused.
func (e *Engine) settleNow(a *attempt, outs []outcome, now time.Time) error {
	if len(outs) == 0 {
		return nil
	}
	s := &settlement{notices: map[dsn.Action][]dsn.Recipient{}, started: a.start}
	var rec queue.Destination // learns nothing: no destination answered
	for _, o := range outs {
		e.settleOne(s, &rec, a, o, now)
	}
	u, actions := e.conclude(a, s, outs, now)
	if _, err := e.q.Apply(u); err != nil {
		return err
	}
	e.report(a, s.lines, actions)
	return nil
}

// conclude completes what settleOne decided: the DSN messages (with their
// actions, for the metric) and the events of the results, in the update
// that stores them.
func (e *Engine) conclude(a *attempt, s *settlement, outs []outcome, now time.Time) (queue.Update, []dsn.Action) {
	var actions []dsn.Action
	s.u.DSNs, actions = e.notices(a, s.notices, now)
	e.attachEvents(a, s)
	u := s.u
	u.Starts = freshStart(a, outs)
	return u, actions
}

// submit logs and counts po's attempt, then hands its update to the queue
// and to the recorder.
func (e *Engine) submit(po *pendingOutcome) {
	e.report(&po.a, po.lines, po.actions)
	p := e.q.ApplyAsync(po.u)
	po.wait = func() error {
		_, err := p.Wait()
		return err
	}
	e.out.hand(po)
}

// adopt makes rec d's current record, and updates what the loop
// schedules by (its throttle, how long d's run of accepted messages
// matters). The loop's goroutine only.
func (e *Engine) adopt(d *dest, rec queue.Destination) {
	d.rec = rec
	d.throttle, d.runKept = backoff.Throttle{Level: rec.ThrottleLevel, Until: rec.ThrottledUntil}, pace(&rec).RunEnds()
	e.notePace(d, rec) // the pace may have changed
}

// grow widens d's ramp for n more recipients accepted or greylisted
// (rampFor), on the loop's goroutine; the loop schedules again when d has
// jobs waiting for another worker. A greylisting reply says nothing of
// what the destination can take (as Postfix's concurrency feedback counts
// only failed sessions against it), and the first attempts of a burst to
// a new greylisting domain start every triplet's delay: held to one
// connection until a message passed, they took a round trip or more each.
func (e *Engine) grow(d *dest, n int) {
	d.answered += n
	was := d.ramp
	d.ramp = rampFor(e.cfg.Delivery.InitialPerDestination, d.answered, e.cfg.Delivery.MaxPerDestination)
	if d.ramp > was && len(d.pending) > 0 {
		e.rewake = true
	}
}

// sameDest reports whether a and b hold the same knowledge (Updated
// aside). The run of accepted messages of a destination that has never
// refused (PaceRun, PaceRunStart) does not count: it grows with every
// delivered message, and storing the record (and sharing it with other
// nodes) for each message would cost a database write and a Redis write
// per message to learn nothing yet. It lives in memory (d.rec) and is
// stored with the next change that counts, such as the refusal that
// makes it useful; a restart before that only loses the estimate of the
// opening rate.
//
// It compares field by field (TestSameDestEveryField fails when a field
// is added and not compared here): it runs for every settled attempt, and
// reflect.DeepEqual took 1% of the relay's CPU under load. Times compare
// as instants (time.Time.Equal), and an empty dead-host map as a nil one.
func sameDest(a, b queue.Destination) bool {
	return a.Domain == b.Domain && a.Greylists == b.Greylists &&
		a.GreylistSeen == b.GreylistSeen && a.GreylistPassed == b.GreylistPassed &&
		a.LearnedDelay == b.LearnedDelay && a.LastGreylisted.Equal(b.LastGreylisted) &&
		a.ThrottleLevel == b.ThrottleLevel && a.ThrottledUntil.Equal(b.ThrottledUntil) &&
		maps.EqualFunc(a.DeadHosts, b.DeadHosts, time.Time.Equal) && a.LastReply == b.LastReply &&
		a.GreylistLow == b.GreylistLow && a.GreylistProbes == b.GreylistProbes &&
		a.GreylistProbe.Equal(b.GreylistProbe) && a.PaceInterval == b.PaceInterval &&
		a.PaceBase == b.PaceBase && a.PaceRefusals == b.PaceRefusals &&
		a.GreylistChecked.Equal(b.GreylistChecked) && a.GreyLike == b.GreyLike &&
		a.GreyLikePassed == b.GreyLikePassed && a.GreyLikeRefused == b.GreyLikeRefused &&
		a.PaceRefused.Equal(b.PaceRefused) && a.GreylistLearned.Equal(b.GreylistLearned)
}

// settleOne decides one recipient's result.
func (e *Engine) settleOne(s *settlement, rec *queue.Destination, a *attempt, o outcome, now time.Time) {
	res := queue.Result{Key: o.r.Key, End: now, FirstGreylisted: o.r.FirstGreylisted,
		GreylistTries: o.r.GreylistTries, DelayWarnings: o.r.DelayWarnings}
	routeOverride(&res, a.t, o.r)
	if res.TLS == "" {
		res.TLS = a.tried.policy // no host answered: the policy the last one was tried under
	}
	switch {
	case o.kind == bounced:
		e.bounced(s, a, o, &res)
	case o.kind.action() != "":
		e.operated(s, o, &res)
	case o.ok:
		e.delivered(s, rec, a, o, &res, now)
	case o.v.Outcome == classifier.Failed:
		e.failed(s, a, o, &res, o.v.Status(), false)
	case !now.Before(e.deadline(a.msg)):
		// The lifetime is over: fail with 4.4.7 (RFC 3463 "delivery time
		// expired"), keeping the last reason and reply for the diagnosis. An
		// expired DSN is only logged: no DSN is ever sent about a DSN.
		e.failed(s, a, o, &res, "4.4.7", true)
		s.expired = true
	case o.kind == postponed:
		e.postponed(s, o, &res)
	default:
		e.deferred(s, rec, a, o, &res, now)
	}
	s.u.Results = append(s.u.Results, res)
}

// routeOverride sets where the recipient's sticky route points after this
// attempt: the host that answered, or, if none did, back to where it
// pointed before (Begin stored the first host tried), so a recipient that
// was greylisted at one MX keeps going there while the network hiccups.
func routeOverride(res *queue.Result, t target, r queue.Recipient) {
	if t.addr.IsValid() {
		res.SourceIP, res.MXHost, res.MXAddr, res.TLS = t.source, t.host, t.addr.String(), t.policy
		return
	}
	res.SourceIP, res.MXHost, res.MXAddr = r.SourceIP, r.MXHost, r.MXAddr
}

// delivered records an accepted recipient.
func (e *Engine) delivered(s *settlement, rec *queue.Destination, a *attempt, o outcome, res *queue.Result, now time.Time) {
	res.Status = queue.Delivered
	if a.relay {
		res.Status = queue.Relayed
	}
	res.Reply = queue.Reply{Code: o.reply.Code, Enhanced: o.reply.Enhanced, Text: o.reply.Text}
	res.Stage = smtpvocab.StageEndOfData.String()
	if !o.r.FirstGreylisted.IsZero() {
		passed := now.Sub(o.r.FirstGreylisted)
		e.learnPassAt(s, rec, res.MXAddr, passed, now)
		e.m.GreylistPass.Observe(passed.Seconds())
	}
	res.FirstGreylisted, res.GreylistTries = time.Time{}, 0
	e.noteFirstRetry(s, o, res, nil, now)
	s.success = true
	s.accepted++
	e.m.AttemptsPerMsg.Observe(float64(o.r.Attempts + 1))
	// RFC 3461 §5.2.2: a peer without the DSN extension cannot report
	// success, so we report "relayed" ourselves when SUCCESS was asked for.
	if notifies(o.r.Notify, notifySuccess) && !a.peerDSN {
		s.notices[dsn.Relayed] = append(s.notices[dsn.Relayed], e.dsnRecipient(a, o, dsn.Relayed, "2.0.0", now))
	}
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(res.Status), reason: "none",
		code: o.reply.Code, enhanced: o.reply.Enhanced, text: o.reply.Text})
}

// failed records a permanent failure, or an expiry (status "4.4.7").
func (e *Engine) failed(s *settlement, a *attempt, o outcome, res *queue.Result, status string, expired bool) {
	res.Status = queue.Failed
	res.Reason = string(o.v.Reason)
	res.Reply = queue.Reply{Code: o.v.Code, Enhanced: o.v.Enhanced, Text: o.v.Text}
	res.Stage = o.v.Stage.String()
	if notifies(o.r.Notify, notifyFailure) {
		s.notices[dsn.Failed] = append(s.notices[dsn.Failed], e.dsnRecipient(a, o, dsn.Failed, status, res.End))
	}
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(queue.Failed), reason: string(o.v.Reason),
		code: o.v.Code, enhanced: o.v.Enhanced, text: o.v.Text, expired: expired, status: status,
		suppressed: o.suppressed && !expired})
}

// suppress hands an address failure to Options.Suppress: a 5xx reply
// whose reason is about the mailbox (classifier.NoSuchUser: X.1.x and
// X.2.1, "user unknown" and the like). Policy and content refusals
// (X.7.x, "spam") say nothing about the address and are not suppressed.
// It runs on the worker's goroutine, before the outcome is settled
// (settleAttempt): the list may wait on a disk.
func (e *Engine) suppress(a *attempt, o outcome, at time.Time) bool {
	if e.opt.Suppress == nil || o.v.Reason != classifier.NoSuchUser || o.v.Code/100 != 5 {
		return false
	}
	reply := strconv.Itoa(o.v.Code) + " " + o.v.Enhanced + " " + o.v.Text
	return e.opt.Suppress(a.msg.From, o.r.Addr, string(o.v.Reason), strings.TrimSpace(reply), at)
}

// deferred records a temporary failure and schedules the next attempt.
func (e *Engine) deferred(s *settlement, rec *queue.Destination, a *attempt, o outcome, res *queue.Result, now time.Time) {
	e.noteFirstRetry(s, o, res, &o.v, now)
	if e.greyLike(s, res.MXAddr, o.v, now) {
		o.v.Reason = classifier.Greylisted // by its host's behaviour (host.go)
	}
	in := backoff.Input{Kind: backoff.Generic, Attempt: o.r.Attempts + 1, GreylistTries: o.r.GreylistTries, Hint: o.v.Hint}
	var paced time.Duration
	switch o.v.Reason {
	case classifier.Greylisted:
		in.Kind = backoff.Greylisted
		s.greylisted++
		in.GreylistTries++
		res.GreylistTries = in.GreylistTries
		if res.FirstGreylisted.IsZero() {
			res.FirstGreylisted = now
		}
	case classifier.RateLimited:
		in.Kind = backoff.RateLimited
		if !s.limited && s.started.After(s.lastRefused) {
			// A transaction started before the last refusal was
			// learned was under way when the window filled: its
			// refusal tells nothing new, and doubling the gap for it
			// would stretch the opening by a factor of 2 per
			// transaction under way.
			setPace(rec, pace(rec).OnRefused())
			rec.PaceRefused = now
		}
		s.rated, s.limited = o.v, true
		if o.v.Hint <= 0 {
			paced = rec.PaceInterval // back in line at the learned pace
		}
	}
	wait := paced
	switch {
	case in.Kind == backoff.Greylisted:
		wait = e.greylistWaitAt(s, rec, res.MXAddr, in, res.FirstGreylisted, now)
	case wait <= 0:
		wait = e.policy.Next(in, e.opt.Rand())
	}
	next := now.Add(wait)
	// Never schedule past the deadline: the last try happens at the
	// deadline, and its deferral expires the recipient.
	if dl := e.deadline(a.msg); next.After(dl) {
		next = dl
	}
	res.Status, res.NextAttempt = queue.Deferred, next
	res.Reason = string(o.v.Reason)
	res.Reply = queue.Reply{Code: o.v.Code, Enhanced: o.v.Enhanced, Text: o.v.Text}
	res.Stage = o.v.Stage.String()
	if n := e.warningsDue(a.msg.Arrival, now); n > o.r.DelayWarnings {
		res.DelayWarnings = n
		if notifies(o.r.Notify, notifyDelay) {
			s.notices[dsn.Delayed] = append(s.notices[dsn.Delayed], e.dsnRecipient(a, o, dsn.Delayed, o.v.Status(), now))
		}
	}
	s.lines = append(s.lines, logLine{r: o.r, res: *res, outcome: string(queue.Deferred), reason: string(o.v.Reason),
		code: o.v.Code, enhanced: o.v.Enhanced, text: o.v.Text})
}

// lifetime is how long the engine tries to deliver msg: retry.lifetime,
// or retry.dsn_lifetime (capped at retry.lifetime) for a DSN. RFC 5321
// §4.5.4.1: "it MAY be appropriate to set a shorter maximum number of
// retries for non-delivery notifications"; a bounce to a sender who cannot
// receive mail should not sit in the queue for five days.
func (e *Engine) lifetime(msg queue.Message) time.Duration {
	if msg.DSN && e.cfg.Retry.DSNLifetime > 0 {
		return min(e.cfg.Retry.DSNLifetime, e.policy.Lifetime)
	}
	return e.policy.Lifetime
}

// deadline is when the engine gives up on msg (see lifetime).
func (e *Engine) deadline(msg queue.Message) time.Time {
	return msg.Arrival.Add(e.lifetime(msg))
}

// warningsDue is how many of retry.delay_warnings a message that arrived
// at arrival has reached at now.
func (e *Engine) warningsDue(arrival, now time.Time) int {
	n := 0
	for _, w := range e.cfg.Retry.DelayWarnings {
		if !now.Before(arrival.Add(w)) {
			n++
		}
	}
	return n
}

// report counts the DSNs of one settled attempt (actions) and writes the
// one log line per recipient, and counts it: every outcome's line and
// counters are written here.
func (e *Engine) report(a *attempt, lines []logLine, actions []dsn.Action) {
	for _, action := range actions {
		e.m.DSNs.WithLabelValues(string(action)).Inc()
	}
	for _, l := range lines {
		switch l.kind {
		case postponed: // no attempt and no end: not counted
			if l.note != "" {
				e.log.Info(l.note, zap.String("queue_id", l.r.Key.ID.String()), zap.String("rcpt", l.r.Addr),
					zap.String("domain", l.r.Domain), zap.Int("attempts", l.r.Attempts),
					zap.Time("next_attempt", l.res.NextAttempt))
			}
		case bounced:
			e.m.Deliveries.WithLabelValues(l.outcome, l.reason).Inc()
			e.m.Recent.Add(l.outcome, l.res.End)
			e.log.Info("bounced by the operator", zap.String("queue_id", l.r.Key.ID.String()),
				zap.String("rcpt", l.r.Addr), zap.String("domain", l.r.Domain), zap.String("outcome", l.outcome),
				zap.String("reason", l.reason), zap.String("enhanced", l.status))
		case opHeld, opReleased, opDeleted:
			e.logOperated(l)
		case attempted:
			e.logAttempt(a, l)
		}
	}
}

// logAttempt writes the one line per recipient and attempt, and counts it.
func (e *Engine) logAttempt(a *attempt, l logLine) {
	e.m.Deliveries.WithLabelValues(l.outcome, l.reason).Inc()
	e.m.Recent.Add(l.outcome, l.res.End)
	mx, mxAddr, source, n := a.tried.host, a.tried.addrString(), a.tried.source, l.r.Attempts+1
	if a.none {
		mx, mxAddr, source, n = l.r.MXHost, l.r.MXAddr, l.r.SourceIP, l.r.Attempts
	}
	fields := []zap.Field{
		zap.String("queue_id", l.r.Key.ID.String()),
		zap.String("rcpt", l.r.Addr),
		zap.String("domain", l.r.Domain),
		zap.String("mx", mx),
		zap.String("mx_addr", mxAddr),
		zap.String("source_ip", source),
		zap.Int("attempt", n),
		zap.String("outcome", l.outcome),
		zap.String("reason", l.reason),
		zap.Int("code", l.code),
		zap.String("enhanced", l.enhanced),
		zap.String("reply", l.text),
		zap.Duration("delay", l.res.End.Sub(a.msg.Arrival)),
	}
	if l.res.TLS != "" {
		fields = append(fields, zap.String("tls_policy", l.res.TLS))
	}
	if !l.res.NextAttempt.IsZero() {
		fields = append(fields, zap.Time("next_attempt", l.res.NextAttempt))
	}
	msg := "delivery attempt"
	if l.expired {
		msg = "delivery attempt; lifetime expired, giving up (4.4.7)"
	}
	e.log.Info(msg, fields...)
}
