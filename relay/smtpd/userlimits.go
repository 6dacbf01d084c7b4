package smtpd

import (
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
// never after DATA, and counted when a message is committed. The counts
// are kept in memory, per node, in one-minute buckets over the last day.

// bucketsPerDay is the number of one-minute buckets a day holds.
const bucketsPerDay = 24 * 60

type usage struct {
	minute      [bucketsPerDay]int64 // the minute (Unix) bucket i counts, to tell stale buckets
	msgs, rcpts [bucketsPerDay]int32
}

// userQuota keeps every identity's usage.
type userQuota struct {
	lim config.UserLimits
	mu  sync.Mutex
	by  map[string]*usage
}

func newUserQuota(lim config.UserLimits) *userQuota {
	if !lim.Any() {
		return nil
	}
	return &userQuota{lim: lim, by: make(map[string]*usage)}
}

// sums returns user's messages and recipients in the last hour and day.
func (q *userQuota) sums(user string, now time.Time) (mh, md, rh, rd int) {
	u := q.by[user]
	if u == nil {
		return
	}
	m := now.Unix() / 60
	for i := range u.minute {
		age := m - u.minute[i]
		if age < 0 || age >= bucketsPerDay {
			continue
		}
		md, rd = md+int(u.msgs[i]), rd+int(u.rcpts[i])
		if age < 60 {
			mh, rh = mh+int(u.msgs[i]), rh+int(u.rcpts[i])
		}
	}
	return
}

// overMessages names the message limit a new message from user would
// pass ("" for none).
func (q *userQuota) overMessages(user string, now time.Time) string {
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
	u := q.by[user]
	if u == nil {
		u = &usage{}
		q.by[user] = u
	}
	m := now.Unix() / 60
	i := m % bucketsPerDay
	if u.minute[i] != m {
		u.minute[i], u.msgs[i], u.rcpts[i] = m, 0, 0
	}
	u.msgs[i]++
	u.rcpts[i] += int32(rcpts)
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
