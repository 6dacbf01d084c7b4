package delivery

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/classifier"
	"github.com/greyrelay/greyrelay/queue"
)

// maxFollowUps bounds the follow-up transactions one attempt sends for
// recipients refused with "too many recipients" (RFC 5321 §4.5.3.1.10).
const maxFollowUps = 3

// work is one worker: it serves d's jobs, one connection at a time, until
// there is none left for it, the destination is paused, or another domain
// waits for a connection slot. Its outcomes are collected by the
// recorder (record.go), which Run stops only after every worker has ended.
func (e *Engine) work(ctx context.Context, d *dest) {
	release, lost, ok := e.takeSlot(d)
	if !ok {
		return
	}
	defer release()
	var s *session
	defer func() { e.closeSession(ctx, s) }()
	reply := make(chan answer, 2) // room for every answer outstanding (ask)
	for served := 0; ctx.Err() == nil; served++ {
		if !e.awaitJob(ctx, d, s, reply, lost, served) {
			return
		}
		taken, refused, ok := e.paceWait(ctx, d, func() { e.closeSession(ctx, s); s = nil })
		if !ok {
			return
		}
		j, r := e.nextJob(ctx, d, s, reply, served)
		if j == nil {
			e.giveBackStart(d, taken)
			continue // another worker took it: wait again
		}
		j.refused = refused
		s = e.runJob(ctx, d, j, s, r)
	}
}

// awaitJob reports whether d has a job for this worker, waiting up to
// delivery.connection_cache_time for one when its connection s is open and
// may carry more. Without that wait, a message arriving just after the
// last one was sent found the worker closing its connection (a worker
// still counts against the destination's concurrency), waited for it to
// end, for a scan, and for a new worker to dial, greet and say EHLO. The
// loop decides (answerAwait): it answers at once, or parks the worker
// with d's idle connections and answers when it claims a job for d or
// wants the slot for another domain (wakeIdle). It reports false when the
// worker should end: nothing came, ctx ended, d is paused, another domain
// waits for a connection slot (fairness), or the cluster took the
// worker's slot back (lost is closed: Shared.Acquire). This is the
// message boundary where a worker gives up its connection.
func (e *Engine) awaitJob(ctx context.Context, d *dest, s *session, reply chan answer, lost <-chan struct{}, served int) bool {
	open := s != nil && s.count < e.cfg.Delivery.MaxMessagesPerConnection && e.cfg.Delivery.ConnectionCacheTime > 0
	var t *time.Timer
	for {
		select {
		case <-lost:
			return false
		default:
		}
		ans, ok := e.askLoop(ctx, ask{kind: askAwait, d: d, open: open, served: served, reply: reply})
		if !ok {
			return false
		}
		if !ans.parked {
			return ans.ok
		}
		if t == nil {
			t = time.NewTimer(e.cfg.Delivery.ConnectionCacheTime)
			defer t.Stop()
		}
		select {
		case ans = <-reply:
			if ans.recheck {
				continue
			}
			return ans.ok
		case <-ctx.Done():
		case <-t.C:
		case <-lost:
		}
		// Leave the idle list; the loop answers once more, either the
		// answer it already gave or none, so reply is empty for the
		// next ask.
		e.askLoop(ctx, ask{kind: askWithdraw, d: d, reply: reply})
		return false
	}
}

// nextJob asks the loop for d's next job, preferring one the open
// connection s can carry, and for its decision whether the job's message
// may go over s (answerTake).
func (e *Engine) nextJob(ctx context.Context, d *dest, s *session, reply chan answer, served int) (*job, ride) {
	ans, ok := e.askLoop(ctx, ask{kind: askTake, d: d, s: s, served: served, reply: reply})
	if !ok {
		return nil, ride{}
	}
	return ans.job, ans.ride
}

// runJob makes one attempt for j, on s if the loop decided that j may go
// over it (r) or on a new connection, and returns the connection to reuse
// (nil if none).
func (e *Engine) runJob(ctx context.Context, d *dest, j *job, s *session, r ride) *session {
	msg, body, release, err := e.load(j)
	if err != nil {
		e.dropped(j.rcpts)                      // without a write: behind the scan position
		if !errors.Is(err, queue.ErrNotFound) { // deleted by the operator: nothing to do
			e.log.Error("delivery: loading message failed", zap.String("queue_id", j.id.String()), zap.Error(err))
		}
		return s
	}
	defer release()
	if e.bounceSuppressed(d, j, msg, body); len(j.rcpts) == 0 {
		return s
	}
	// The open connection carries j only if the loop found that it gives
	// j's message every TLS guarantee its own policy demands (reuse);
	// otherwise the message opens its own, under its own policy.
	t := r.t
	if s != nil && !r.ok {
		e.closeSession(ctx, s)
		s = nil
	}
	a := &attempt{msg: msg, body: body, start: e.now(), refused: j.refused}
	if s == nil {
		return e.overHosts(ctx, d, j, a, leftover{}, false)
	}
	// No RSET first: after a completed transaction none is needed (RFC
	// 5321 §4.1.1.4), and smtpclient sends one itself after one that did
	// not complete. A connection the peer closed while idle fails at MAIL
	// with no recipient answered, so all of j goes to a fresh connection
	// below, in this same attempt: no deferral. The lease covers the other
	// hosts too, should this connection fail.
	if !e.begin(j, a, s.t, 1+maxTargets) {
		return s
	}
	if !e.paceGate(ctx, d, a, s.t.addrString(), func() { e.closeSession(ctx, s); s = nil }) {
		return s // shutting down: the attempt stays Active and is recovered
	}
	if s == nil { // closed for a long wait: a fresh connection
		return e.overHosts(ctx, d, j, a, leftover{rcpts: j.rcpts}, true)
	}
	s, rest := e.transact(ctx, d, a, s, t, j.rcpts)
	if len(rest.rcpts) == 0 || ctx.Err() != nil {
		return s
	}
	// The reused connection failed: a fresh one, to this host or the next.
	return e.overHosts(ctx, d, j, a, rest, true)
}

// load returns j's envelope and body: a fresh job's own copies, or the
// queue's. A large body is a mapped spool file, not a heap copy; every
// use of it (the transactions, a DSN's returned content) ends before
// runJob returns and calls release.
func (e *Engine) load(j *job) (queue.Message, []byte, func(), error) {
	if j.fresh != nil {
		return j.fresh.msg, j.fresh.body, func() {}, nil
	}
	msg, err := e.q.Message(j.id)
	if err != nil {
		return msg, nil, nil, err
	}
	c, err := e.q.OpenBody(j.id)
	if err != nil {
		return msg, nil, nil, err
	}
	return msg, c.Bytes(), func() { _ = c.Close() }, nil
}

// begin records the attempt a for j's recipients before anything is sent
// (queue.Begin), with t as the first host and a lease for hops hosts.
// Recipients the operator held, bounced or deleted since they were
// claimed are dropped from j. It reports whether any is left. Either way
// the loop is told that j's recipients are no longer claimed (Begun ones
// are Active and invisible to the scan), and how the Begin went
// (storagePause).
func (e *Engine) begin(j *job, a *attempt, t target, hops int) bool {
	now := a.start
	start := queue.Start{Keys: j.keys(), Time: now, SourceIP: t.source, MXHost: t.host,
		MXAddr: t.addrString(), LeaseUntil: now.Add(e.lease(hops, len(j.rcpts)))}
	if j.fresh != nil {
		// No Begin: the start is stored with the outcome, and the
		// recipients stay claimed until then (fresh.go).
		a.begun = &start
		return true
	}
	claimed := start.Keys
	err := e.q.Begin(start)
	if errors.Is(err, queue.ErrState) || errors.Is(err, queue.ErrNotFound) {
		if j.rcpts = e.stillDue(j); len(j.rcpts) == 0 {
			e.tell(note{unclaim: claimed})
			return false
		}
		start.Keys = j.keys()
		err = e.q.Begin(start)
	}
	if err != nil {
		e.log.Error("delivery: recording the attempt failed", zap.String("queue_id", j.id.String()), zap.Error(err))
		// Dropped without a write: behind the scan position.
		e.tell(note{unclaim: claimed, rescan: true, begun: true, failedAt: e.now()})
		return false
	}
	e.tell(note{unclaim: claimed, begun: true})
	return true
}

// stillDue returns the recipients of j that may still be attempted.
func (e *Engine) stillDue(j *job) []queue.Recipient {
	rs, err := e.q.Select(queue.Selector{ID: j.id})
	if err != nil {
		return nil
	}
	var out []queue.Recipient
	for _, r := range j.rcpts {
		k := slices.IndexFunc(rs, func(x queue.Recipient) bool { return x.Key == r.Key })
		if k >= 0 && (rs[k].Status == queue.Queued || rs[k].Status == queue.Deferred) {
			out = append(out, rs[k])
		}
	}
	return out
}

// lease is how long an attempt may take: every timeout it may spend on
// hops hosts (the setup twice, for the plaintext retry under TLS "may", and
// a transaction, since a host may fail in the middle of one) and on the
// follow-up transactions. It only matters after a crash (queue.Recover).
func (e *Engine) lease(hops, rcpts int) time.Duration {
	d := e.cfg.Delivery
	setup := d.ConnectTimeout + d.GreetingTimeout + 5*d.CommandTimeout // EHLO, STARTTLS, handshake, EHLO, AUTH
	tx := time.Duration(rcpts+3)*d.CommandTimeout + 2*d.DataTimeout    // RSET, MAIL, RCPTs, DATA; data, final dot
	return time.Duration(max(hops, 1))*(2*setup+tx) + maxFollowUps*tx
}

// early settles j without a connection (DNS failure, every host known to
// be down): the attempt is recorded and deferred or failed at once.
func (e *Engine) early(d *dest, j *job, a *attempt, v classifier.Verdict) {
	if !e.begin(j, a, target{}, 1) {
		return
	}
	e.settleAttempt(d, a, outcomesOf(j.rcpts, v))
}

func outcomesOf(rs []queue.Recipient, v classifier.Verdict) []outcome {
	outs := make([]outcome, len(rs))
	for i, r := range rs {
		outs[i] = outcome{r: r, v: v}
	}
	return outs
}
