package smtpd

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/greyrelay/greyrelay/relay/config"
)

// Per-identity sending limits (user_limits): messages and recipients per
// sliding hour and day for each AUTH user and API token, and each client
// relaying by trusted_networks without AUTH (by address), so that one
// compromised or runaway application cannot spend the whole relay's
// reputation. They are checked at MAIL (messages) and RCPT (recipients),
// never after DATA, and counted when a message is committed, in
// one-minute buckets over the last day.
//
// The counts outlive the process and are shared by a cluster's nodes
// through a UsageStore (the queue's file on one node, Redis in a
// cluster): a relay restarted in a loop, or an application spread over
// several nodes, still meets its quota. Checks read this node's copy,
// never the store: the first check of an identity since the start (or
// since it was idle for usageIdle) reads the store, then while it sends,
// every usageSync, each node adds what it counted and reads the sum back. So the nodes of a cluster may together pass a limit
// by what they accept within one usageSync, and while the store is away
// each node counts on its own (from what it last read).

// UsageStore keeps user_limits counts beyond one process (relay/cluster
// over Redis; the queue's file on one node). Its one method returns
// quickly; ok false means the store is away.
type UsageStore interface {
	// AddUsage adds add (one-minute bucket, as Unix minutes → messages,
	// recipients) to id's counts, forgets buckets before since, and
	// returns id's counts as the store now has them.
	AddUsage(id string, add map[int64][2]int64, since int64) (map[int64][2]int64, bool)
}

// usageSync is how often the counts of active identities are exchanged
// with the UsageStore.
const usageSync = time.Second

// usageIdle is how long after its last check or message an identity stops
// being exchanged every usageSync; its next check reads the store first.
// So the store's traffic follows the identities that are sending, not
// every one seen in the last day.
const usageIdle = time.Minute

// bucketsPerDay is the number of one-minute buckets a day holds.
const bucketsPerDay = 24 * 60

type usage struct {
	base    map[int64][2]int64 // the store's counts (all counts without one)
	pend    map[int64][2]int64 // counted here since the last exchange
	synced  bool               // the store's counts were read once
	lastUse time.Time
	read    time.Time // the last exchange
}

// userQuota keeps every identity's usage.
type userQuota struct {
	lim   config.UserLimits
	store UsageStore // nil: counts live in this process alone
	mu    sync.Mutex
	by    map[string]*usage
	xmu   sync.Mutex // one exchange with the store at a time
	// report, if set, is told an identity's messages in the last hour
	// after each exchange (the metric greyrelay_user_messages_last_hour).
	report func(id string, lastHour int)
}

func newUserQuota(lim config.UserLimits, store UsageStore) *userQuota {
	if !lim.Any() {
		return nil
	}
	return &userQuota{lim: lim, store: store, by: make(map[string]*usage)}
}

// get returns user's usage, created empty. Called with q.mu held.
func (q *userQuota) get(user string) *usage {
	u := q.by[user]
	if u == nil {
		u = &usage{base: map[int64][2]int64{}, pend: map[int64][2]int64{}}
		q.by[user] = u
	}
	return u
}

// sums returns user's messages and recipients in the last hour and day.
// Called with q.mu held.
func (q *userQuota) sums(user string, now time.Time) (mh, md, rh, rd int) {
	u := q.by[user]
	if u == nil {
		return
	}
	m := now.Unix() / 60
	for _, set := range []map[int64][2]int64{u.base, u.pend} {
		for minute, c := range set {
			age := m - minute
			if age < 0 || age >= bucketsPerDay {
				continue
			}
			md, rd = md+int(c[0]), rd+int(c[1])
			if age < 60 {
				mh, rh = mh+int(c[0]), rh+int(c[1])
			}
		}
	}
	return
}

// overMessages names the message limit a new message from user would
// pass ("" for none).
func (q *userQuota) overMessages(user string, now time.Time) string {
	q.first(user, now)
	q.mu.Lock()
	defer q.mu.Unlock()
	mh, md, _, _ := q.sums(user, now)
	lim := q.lim.For(user)
	switch {
	case lim.MessagesPerHour > 0 && mh >= lim.MessagesPerHour:
		return strconv.Itoa(lim.MessagesPerHour) + " messages per hour"
	case lim.MessagesPerDay > 0 && md >= lim.MessagesPerDay:
		return strconv.Itoa(lim.MessagesPerDay) + " messages per day"
	}
	return ""
}

// overRecipients names the recipient limit that pending more recipients
// (those of the message in progress, the new one included) would pass.
func (q *userQuota) overRecipients(user string, pending int, now time.Time) string {
	q.first(user, now)
	q.mu.Lock()
	defer q.mu.Unlock()
	_, _, rh, rd := q.sums(user, now)
	lim := q.lim.For(user)
	switch {
	case lim.RecipientsPerHour > 0 && rh+pending > lim.RecipientsPerHour:
		return strconv.Itoa(lim.RecipientsPerHour) + " recipients per hour"
	case lim.RecipientsPerDay > 0 && rd+pending > lim.RecipientsPerDay:
		return strconv.Itoa(lim.RecipientsPerDay) + " recipients per day"
	}
	return ""
}

// add counts a committed message of user with rcpts recipients.
func (q *userQuota) add(user string, rcpts int, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.get(user)
	u.lastUse = now
	set := u.base
	if q.store != nil {
		set = u.pend
	}
	m := now.Unix() / 60
	c := set[m]
	set[m] = [2]int64{c[0] + 1, c[1] + int64(rcpts)}
}

// first reads user's counts from the store the first time user is
// checked since the start, or since it was idle (usageIdle).
func (q *userQuota) first(user string, now time.Time) {
	if q.store == nil {
		return
	}
	q.mu.Lock()
	u := q.get(user)
	u.lastUse = now
	fresh := u.synced && now.Sub(u.read) < usageIdle
	q.mu.Unlock()
	if !fresh {
		q.exchange(user, now)
	}
}

// exchange adds user's pending counts to the store and takes the store's
// sum as user's base. While the store is away the counts stay pending.
func (q *userQuota) exchange(user string, now time.Time) {
	q.xmu.Lock()
	defer q.xmu.Unlock()
	q.mu.Lock()
	u := q.get(user)
	sent := u.pend
	u.pend = map[int64][2]int64{}
	q.mu.Unlock()
	since := now.Unix()/60 - bucketsPerDay
	got, ok := q.store.AddUsage(user, sent, since)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !ok {
		for m, c := range sent {
			p := u.pend[m]
			u.pend[m] = [2]int64{p[0] + c[0], p[1] + c[1]}
		}
		return
	}
	u.base, u.synced, u.read = got, true, now
	for m := range u.base {
		if m < since {
			delete(u.base, m)
		}
	}
	if q.report != nil {
		mh, _, _, _ := q.sums(user, now)
		q.report(user, mh)
	}
}

// runSync exchanges the counts of every identity that was checked or sent
// within usageIdle (or has counts pending) every usageSync, and once more
// when ctx ends, so that a restart finds them.
func (q *userQuota) runSync(ctx context.Context, now func() time.Time) {
	t := time.NewTicker(usageSync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			q.syncAll(now())
			return
		case <-t.C:
			q.syncAll(now())
		}
	}
}

// KeepUsage exchanges the user_limits counts with Options.Usage until ctx
// ends, and once more then (call it to end after Shutdown, so that the
// last messages count after a restart). Without either it returns at once.
func (s *Server) KeepUsage(ctx context.Context) {
	if s.quota == nil || s.quota.store == nil {
		return
	}
	s.quota.runSync(ctx, s.now)
}

func (q *userQuota) syncAll(now time.Time) {
	q.mu.Lock()
	var ids []string
	for id, u := range q.by {
		if len(u.pend) > 0 || now.Sub(u.lastUse) < usageIdle {
			ids = append(ids, id)
		}
	}
	q.mu.Unlock()
	for _, id := range ids {
		q.exchange(id, now)
	}
}

// limitID is whose limits a transaction counts against: the AUTH user or
// API token, or, for a client relaying by trusted_networks without AUTH,
// its address (an IPv6 client by its limits.ipv6_prefix_length prefix,
// which one host usually owns whole). "" for no one.
func (s *session) limitID() string {
	switch {
	case s.user != "":
		return s.user
	case s.trusted && s.lis.mode == config.ModeSMTP:
		return trustedPrefix + clientKey(s.client.Addr(), s.srv.cfg.Limits.IPv6PrefixLength).String()
	}
	return ""
}

// trustedPrefix starts the limit identity of a trusted client, which no
// user name can (names have no space).
const trustedPrefix = "trusted client "

// metricsID is the user label for id: trusted clients share one, so the
// series count stays that of the users and tokens the operator lists.
func metricsID(id string) string {
	if strings.HasPrefix(id, trustedPrefix) {
		return "(trusted_networks)"
	}
	return id
}

// checkUserMessages refuses MAIL from an identity over its message rate:
// 451 4.7.1, temporary (RFC 3463 X.7.1 is "delivery not authorized";
// Postfix's policy servers answer rate limits the same way), so the
// client keeps the message and tries later.
func (s *session) checkUserMessages(user string) error {
	if s.srv.quota == nil || user == "" {
		return nil
	}
	if over := s.srv.quota.overMessages(user, s.srv.now()); over != "" {
		s.srv.metrics.UserLimited.WithLabelValues(metricsID(user), "messages").Inc()
		return s.refuse(reasonUserLimit, reply(451, 4, 7, 1, "Sending rate limit reached for "+user+": "+over+", try again later"))
	}
	return nil
}

// checkUserRecipients refuses a recipient that would take an identity
// over its recipient rate: 452 4.5.3, as for too many recipients (RFC 5321
// §4.5.3.1.10), so the client sends the rest later.
func (s *session) checkUserRecipients(env *envelope) error {
	if s.srv.quota == nil || env.limitID == "" {
		return nil
	}
	if over := s.srv.quota.overRecipients(env.limitID, len(env.rcpts)+1, s.srv.now()); over != "" {
		s.srv.metrics.UserLimited.WithLabelValues(metricsID(env.limitID), "recipients").Inc()
		return s.refuse(reasonUserLimit, reply(452, 4, 5, 3, "Recipient rate limit reached for "+env.limitID+": "+over+", try again later"))
	}
	return nil
}

// countUser counts an accepted message against its identity.
func (s *session) countUser(env *envelope) {
	if env.limitID == "" {
		return
	}
	s.srv.metrics.UserMessages.WithLabelValues(metricsID(env.limitID)).Inc()
	if s.srv.quota != nil {
		s.srv.quota.add(env.limitID, len(env.rcpts), s.srv.now())
	}
}
