package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/greyrelay/greyrelay/relay/config"
	"github.com/greyrelay/greyrelay/relay/suppress"
)

// redisStore is the Store on Redis: one address is a single server,
// several a Redis Cluster, and master_name selects Sentinel (go-redis's
// UniversalClient).
//
// Keys put the domain in a hash tag ({domain}), so a domain's keys
// share a slot in a Redis Cluster and a script may touch them together.
// Every expiry is measured on the server's clock (TIME in the scripts).
type redisStore struct {
	rdb redis.UniversalClient
}

// NewRedis returns the Store on the Redis r names. It connects lazily:
// go-redis dials on first use.
func NewRedis(r config.Redis) (Store, error) {
	uo, err := universalOptions(r)
	if err != nil {
		return nil, err
	}
	return &redisStore{rdb: redis.NewUniversalClient(uo)}, nil
}

func universalOptions(r config.Redis) (*redis.UniversalOptions, error) {
	if len(r.Addresses) == 0 {
		return nil, errors.New("cluster: cluster.redis.addresses is empty")
	}
	uo := &redis.UniversalOptions{Addrs: r.Addresses, MasterName: r.MasterName, Username: r.Username,
		Password: r.Password, DialTimeout: r.Timeout, ReadTimeout: r.Timeout, WriteTimeout: r.Timeout,
		MaxRetries: -1, PoolSize: 8}
	if r.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: r.TLSServerName}
		if r.TLSCA != "" {
			pem, err := os.ReadFile(r.TLSCA)
			if err != nil {
				return nil, fmt.Errorf("cluster: cluster.redis.tls_ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("cluster: cluster.redis.tls_ca %s: no certificate", r.TLSCA)
			}
		}
		uo.TLSConfig = tc
	}
	return uo, nil
}

// nodeKey is the registry key of a node.
func nodeKey(name string) string { return "greyrelay:node:" + name }

// leaseKey is the sorted set of a domain's leases: members are
// "node/instance/n", scored by their expiry in milliseconds on Redis's
// clock.
func leaseKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:leases" }

// destKey is the shared record of a domain.
func destKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:dest" }

// paceKey holds the last reserved start of a paced domain, in
// microseconds on Redis's clock. (Before, it held the next free start: a
// node of an older version reading it once waits one gap longer.)
func paceKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:pace" }

// freedChannel carries the domains whose lease was released.
const freedChannel = "greyrelay:freed"

// acquireScript: KEYS[1] the lease set, ARGV limit, member, ttl (ms).
// Expired members go first, so a dead node's slots free within ttl.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
`)

// renewScript: KEYS[1] the lease set, ARGV ttl (ms) then member, limit
// pairs. Members present are extended; absent ones are added back while
// the set has room under their limit, and refused otherwise. Returns
// {added, refused}.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local absent = {}
for i = 2, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  else
    table.insert(absent, i)
  end
end
local added, refused = {}, {}
for _, i in ipairs(absent) do
  if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[i + 1]) then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
    table.insert(added, ARGV[i])
  else
    table.insert(refused, ARGV[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {added, refused}
`)

// releaseScript: KEYS[1] the lease set, ARGV member, channel, domain.
// The announcement goes out only for a lease that was still there.
var releaseScript = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return 1
`)

// paceScript: KEYS[1] the domain's last reserved start, ARGV the asking
// node's current gap, how long to keep the start (µs, ms) and how far
// ahead a start may be reserved (µs). On Redis's clock: the start comes
// one gap after the last one, or now; the script returns how long the
// caller waits for it (µs) and, if that is at most ARGV[3], makes it the
// last.
// The gap is the caller's at the moment it asks, not the one the last
// start was reserved with: a probe reserved with a long gap and then
// accepted teaches a short pace, which applies to the very next start.
var paceScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local iv = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[1]) or '-1')
local at = now
if last >= 0 and last + iv > now then at = last + iv end
if at - now <= tonumber(ARGV[3]) then
  redis.call('SET', KEYS[1], string.format('%d', at), 'PX', math.floor((at - now) / 1000) + tonumber(ARGV[2]))
end
return at - now
`)

// heartbeatScript writes a node's registry entry and returns the entry it
// replaced, in one round trip: KEYS[1] is the node's key, ARGV the entry
// and its lifetime in milliseconds. SET's GET option would do the same,
// but only from Redis 6.2 on; a script runs on any Redis the rest of this
// package needs, and an unknown option would mark Redis down for good.
var heartbeatScript = redis.NewScript(`
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return old
`)

// unregisterScript deletes a node's entry only if this process instance
// wrote it: a second process with the same name keeps its own.
var unregisterScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ok, n = pcall(cjson.decode, v)
if ok and type(n) == 'table' and n.instance == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

func (s *redisStore) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

func (s *redisStore) Acquire(ctx context.Context, domain, member string, limit int, ttl time.Duration) (bool, error) {
	got, err := acquireScript.Run(ctx, s.rdb, []string{leaseKey(domain)}, limit, member, ttl.Milliseconds()).Int()
	return got == 1, err
}

// Renew renews every domain's leases in one pipeline.
func (s *redisStore) Renew(ctx context.Context, ttl time.Duration, held map[string]map[string]int) (added, refused map[string][]string, err error) {
	pipe := s.rdb.Pipeline()
	cmds := make(map[string]*redis.Cmd, len(held))
	for domain, members := range held {
		args := []any{ttl.Milliseconds()}
		for m, limit := range members {
			args = append(args, m, limit)
		}
		cmds[domain] = renewScript.Eval(ctx, pipe, []string{leaseKey(domain)}, args...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, nil, err
	}
	added, refused = map[string][]string{}, map[string][]string{}
	for domain, cmd := range cmds {
		v, _ := cmd.Slice()
		if len(v) != 2 {
			continue
		}
		added[domain], refused[domain] = strs(v[0]), strs(v[1])
	}
	return added, refused, nil
}

func strs(v any) []string {
	vs, _ := v.([]any)
	out := make([]string, 0, len(vs))
	for _, x := range vs {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func (s *redisStore) Release(ctx context.Context, domain, member string) error {
	return releaseScript.Run(ctx, s.rdb, []string{leaseKey(domain)}, member, freedChannel, domain).Err()
}

func (s *redisStore) Drop(ctx context.Context, domain, member string) error {
	return s.rdb.ZRem(ctx, leaseKey(domain), member).Err()
}

// Subscribe keeps one subscription for the node's life; in a Redis
// Cluster a PUBLISH reaches the subscribers on every master.
func (s *redisStore) Subscribe(ctx context.Context, freed func(string)) {
	ps := s.rdb.Subscribe(ctx, freedChannel)
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			freed(m.Payload)
		}
	}
}

func (s *redisStore) Record(ctx context.Context, domain string) ([]byte, error) {
	b, err := s.rdb.Get(ctx, destKey(domain)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return b, err
}

func (s *redisStore) SetRecord(ctx context.Context, domain string, rec []byte, refused, updated time.Time, ttl time.Duration) error {
	return setRecordScript.Run(ctx, s.rdb, []string{destKey(domain), versionKey(domain)},
		rec, micros(refused), micros(updated), ttl.Milliseconds()).Err()
}

// micros is t in microseconds since 1970, 0 for the zero time.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

// versionKey holds the version of domain's shared record beside it: a
// hash of its PaceRefused (r) and Updated (u), in microseconds.
func versionKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:dest:v" }

// setRecordScript: KEYS[1] the record, KEYS[2] its version; ARGV the
// record, its version (refused and updated, µs) and the TTL (ms). A
// stored later version (Store.SetRecord) stands; an equal one is replaced
// (the same node publishing again); none (a record written before
// versions were kept) counts as the oldest.
var setRecordScript = redis.NewScript(`
local v = redis.call('HMGET', KEYS[2], 'r', 'u')
local r, u = tonumber(v[1]) or 0, tonumber(v[2]) or 0
local nr, nu = tonumber(ARGV[2]), tonumber(ARGV[3])
if r > nr or (r == nr and u > nu) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[4])
redis.call('HSET', KEYS[2], 'r', ARGV[2], 'u', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
`)

// runsKey is the hash of the nodes' runs of accepted messages to a
// domain, one field per node; the hash expires a run's span after its
// last write, and a stale field is ignored by its start time.
func runsKey(domain string) string { return "greyrelay:{" + strings.ToLower(domain) + "}:runs" }

func (s *redisStore) Runs(ctx context.Context, domain string) (map[string][]byte, error) {
	return s.hashBytes(ctx, runsKey(domain))
}

// hashBytes returns the fields of the hash at key.
func (s *redisStore) hashBytes(ctx context.Context, key string) (map[string][]byte, error) {
	m, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = []byte(v)
	}
	return out, nil
}

func (s *redisStore) SetRun(ctx context.Context, domain, node string, v []byte, ttl time.Duration) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, runsKey(domain), node, v)
		p.PExpire(ctx, runsKey(domain), ttl)
		return nil
	})
	return err
}

// suspendKey is the hash of the operator's suspensions, one field per
// domain: one key keeps the whole set one read (every node reads it every
// few seconds) and in one Redis Cluster slot.
const suspendKey = "greyrelay:suspended"

func (s *redisStore) Suspensions(ctx context.Context) (map[string][]byte, error) {
	return s.hashBytes(ctx, suspendKey)
}

func (s *redisStore) SetSuspension(ctx context.Context, domain string, v []byte) error {
	return s.rdb.HSet(ctx, suspendKey, domain, v).Err()
}

func (s *redisStore) DeleteSuspension(ctx context.Context, domain string) error {
	return s.rdb.HDel(ctx, suspendKey, domain).Err()
}

// paceKeep is how long a domain's last reserved start is kept after it:
// the longest gap a pace asks for (an hour, backoff's bound), so that no
// node's next start finds it gone too early. A key per paced domain.
const paceKeep = time.Hour

func (s *redisStore) Pace(ctx context.Context, domain string, interval, ahead time.Duration) (time.Duration, error) {
	us, err := paceScript.Run(ctx, s.rdb, []string{paceKey(domain)}, interval.Microseconds(), paceKeep.Milliseconds(), ahead.Microseconds()).Int64()
	return time.Duration(us) * time.Microsecond, err
}

func (s *redisStore) Heartbeat(ctx context.Context, name string, entry []byte, ttl time.Duration) ([]byte, error) {
	prev, err := heartbeatScript.Run(ctx, s.rdb, []string{nodeKey(name)}, entry, ttl.Milliseconds()).Text()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return []byte(prev), nil
}

func (s *redisStore) Unregister(ctx context.Context, name, instance string) error {
	return unregisterScript.Run(ctx, s.rdb, []string{nodeKey(name)}, instance).Err()
}

// Nodes scans the registry keys; SCAN runs on one shard of a Redis
// Cluster, so there it asks every master.
func (s *redisStore) Nodes(ctx context.Context) ([][]byte, error) {
	var keys []string
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			it := m.Scan(ctx, 0, nodeKey("*"), 100).Iterator()
			for it.Next(ctx) {
				mu.Lock()
				keys = append(keys, it.Val())
				mu.Unlock()
			}
			return it.Err()
		})
		if err != nil {
			return nil, err
		}
	} else {
		it := s.rdb.Scan(ctx, 0, nodeKey("*"), 100).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	var out [][]byte
	for _, k := range keys {
		b, err := s.rdb.Get(ctx, k).Bytes()
		if err != nil {
			continue // expired between SCAN and GET
		}
		out = append(out, b)
	}
	return out, nil
}

func (s *redisStore) Close() error { return s.rdb.Close() }

// RouteRedisLogs sends go-redis's own log lines (pool dial failures and
// the like, otherwise printed to stderr) to log at debug level: the
// cluster's state changes are logged once each by this package, and a
// Redis that is down would otherwise print a line per dial. go-redis
// keeps one logger per process, so serve calls this once.
func RouteRedisLogs(log *zap.Logger) {
	redis.SetLogger(redisLog{log.Named("redis")})
}

type redisLog struct{ log *zap.Logger }

// Printf implements go-redis's internal.Logging.
func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}

// The suppression list's keys share one hash tag, so that a script may
// touch them together in a Redis Cluster: the entries (a hash), the log of
// changes (a stream) and the epoch.
const (
	suppressEntriesKey = "greyrelay:{suppressions}:entries"
	suppressLogKey     = "greyrelay:{suppressions}:log"
	suppressEpochKey   = "greyrelay:{suppressions}:epoch"
)

// suppressPutScript: KEYS entries, log; ARGV key, value ("" removes),
// the log's length. The entry and its change are one step.
var suppressPutScript = redis.NewScript(`
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'k', ARGV[1], 'v', ARGV[2])
return 1
`)

// suppressLogScript: KEYS epoch, log; ARGV new epoch, after, count.
// Returns {epoch, changes from after on}.
var suppressLogScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then
  redis.call('SET', KEYS[1], ARGV[1])
  e = ARGV[1]
end
return {e, redis.call('XRANGE', KEYS[2], ARGV[2], '+', 'COUNT', tonumber(ARGV[3]))}
`)

// suppressSnapshotScript: KEYS epoch, log, entries; ARGV new epoch.
// Returns {epoch, the log's last ID, every entry}; an empty log gets a
// marker, so that a node has a position to follow from.
var suppressSnapshotScript = redis.NewScript(`
local e = redis.call('GET', KEYS[1])
if not e then
  redis.call('SET', KEYS[1], ARGV[1])
  e = ARGV[1]
end
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local id
if #last > 0 then
  id = last[1][1]
else
  id = redis.call('XADD', KEYS[2], '*', 'k', '', 'v', '')
end
return {e, id, redis.call('HGETALL', KEYS[3])}
`)

// suppressForgetScript: KEYS entries; ARGV key, value.
var suppressForgetScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
`)

func (s *redisStore) SuppressionPut(ctx context.Context, key string, v []byte) error {
	return suppressPutScript.Run(ctx, s.rdb, []string{suppressEntriesKey, suppressLogKey}, key, v, suppressionLogLen).Err()
}

func (s *redisStore) SuppressionLog(ctx context.Context, newEpoch, after string, limit int) (string, []suppress.Change, error) {
	v, err := suppressLogScript.Run(ctx, s.rdb, []string{suppressEpochKey, suppressLogKey}, newEpoch, after, limit).Slice()
	if err != nil {
		return "", nil, err
	}
	if len(v) != 2 {
		return "", nil, fmt.Errorf("cluster: suppression log: %d values", len(v))
	}
	epoch, _ := v[0].(string)
	return epoch, logEntries(v[1]), nil
}

// logEntries decodes XRANGE's answer: {{id, {field, value, ...}}, ...}.
func logEntries(v any) []suppress.Change {
	rows, _ := v.([]any)
	out := make([]suppress.Change, 0, len(rows))
	for _, r := range rows {
		pair, _ := r.([]any)
		if len(pair) != 2 {
			continue
		}
		e := suppress.Change{}
		e.ID, _ = pair[0].(string)
		fields := strs(pair[1])
		for i := 0; i+1 < len(fields); i += 2 {
			switch fields[i] {
			case "k":
				e.Key = fields[i+1]
			case "v":
				if fields[i+1] != "" {
					e.Value = []byte(fields[i+1])
				}
			}
		}
		out = append(out, e)
	}
	return out
}

func (s *redisStore) SuppressionSnapshot(ctx context.Context, newEpoch string) (string, string, map[string][]byte, error) {
	v, err := suppressSnapshotScript.Run(ctx, s.rdb, []string{suppressEpochKey, suppressLogKey, suppressEntriesKey}, newEpoch).Slice()
	if err != nil {
		return "", "", nil, err
	}
	if len(v) != 3 {
		return "", "", nil, fmt.Errorf("cluster: suppression snapshot: %d values", len(v))
	}
	epoch, _ := v[0].(string)
	last, _ := v[1].(string)
	kv := strs(v[2])
	all := make(map[string][]byte, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		all[kv[i]] = []byte(kv[i+1])
	}
	return epoch, last, all, nil
}

func (s *redisStore) SuppressionForget(ctx context.Context, key string, v []byte) error {
	return suppressForgetScript.Run(ctx, s.rdb, []string{suppressEntriesKey}, key, v).Err()
}

// usageKey is the hash of one identity's user_limits counts: fields
// "m<minute>" (messages) and "r<minute>" (recipients), by Unix minute.
func usageKey(id string) string { return "greyrelay:usage:{" + id + "}" }

// usageTTL is how long an identity's counts outlive its last message: the
// longest window a limit has (a day), and a little more.
const usageTTL = 25 * 60 * 60 * 1000 // ms

// usageScript: KEYS the identity's hash; ARGV since, ttl (ms), then
// minute, messages, recipients for each bucket to add. Returns the
// remaining fields and values.
var usageScript = redis.NewScript(`
for i = 3, #ARGV, 3 do
  redis.call('HINCRBY', KEYS[1], 'm' .. ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[1], 'r' .. ARGV[i], ARGV[i + 2])
end
local all = redis.call('HGETALL', KEYS[1])
local since = tonumber(ARGV[1])
local out = {}
for i = 1, #all, 2 do
  local m = tonumber(string.sub(all[i], 2))
  if m == nil or m < since then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(out, all[i])
    table.insert(out, all[i + 1])
  end
end
if #out > 0 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2])) end
return out
`)

func (s *redisStore) AddUsage(ctx context.Context, id string, add map[int64][2]int64, since int64) (map[int64][2]int64, error) {
	args := []any{since, usageTTL}
	for m, c := range add {
		args = append(args, m, c[0], c[1])
	}
	kv, err := usageScript.Run(ctx, s.rdb, []string{usageKey(id)}, args...).StringSlice()
	if err != nil {
		return nil, err
	}
	return usageFields(kv), nil
}

// usageFields decodes "m<minute>"/"r<minute>" fields and their counts.
func usageFields(kv []string) map[int64][2]int64 {
	out := map[int64][2]int64{}
	for i := 0; i+1 < len(kv); i += 2 {
		f := kv[i]
		if len(f) < 2 {
			continue
		}
		m, err1 := strconv.ParseInt(f[1:], 10, 64)
		n, err2 := strconv.ParseInt(kv[i+1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		c := out[m]
		switch f[0] {
		case 'm':
			c[0] = n
		case 'r':
			c[1] = n
		}
		out[m] = c
	}
	return out
}
