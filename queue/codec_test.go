package queue

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"
)

func sampleRecords() (Message, Recipient, []Attempt, Destination) {
	at := time.Unix(0, t0.UnixNano())
	m := Message{ID: 7, From: "a@b", Arrival: at, Size: 1234, ClientAddr: "127.0.0.1:25",
		AuthUser: "u", Helo: "h", RET: "FULL", EnvID: "e", SMTPUTF8: true, DSN: true}
	r := Recipient{Key: Key{7, 2}, Addr: "ü@d", Domain: "d", Notify: "DELAY", ORCPT: "rfc822;x@d",
		Status: Deferred, Reason: "greylisted", Reply: Reply{451, "4.7.1", "later"}, Attempts: 3,
		NextAttempt: at.Add(time.Hour), FirstAttempt: at, LastAttempt: at.Add(time.Minute),
		FirstGreylisted: at, GreylistTries: 2, SourceIP: "::1", MXHost: "mx", MXAddr: "127.0.0.5",
		DelayWarnings: 1}
	h := []Attempt{{Start: at, End: at.Add(time.Second), SourceIP: "::1", MXHost: "mx", MXAddr: "a",
		Stage: "rcpt", Outcome: "deferred", Reason: "greylisted", Reply: Reply{450, "4.2.0", "x"}},
		{Start: at, Outcome: outcomeInProgress}}
	d := Destination{Domain: "d", Greylists: true, GreylistSeen: 4, GreylistPassed: 3,
		LearnedDelay: 7 * time.Minute, LastGreylisted: at, ThrottleLevel: -1, ThrottledUntil: at,
		DeadHosts: map[string]time.Time{"mx1": at, "127.0.0.9": at.Add(time.Hour)},
		LastReply: Reply{421, "4.7.0", "busy"}, Updated: at}
	return m, r, h, d
}

func TestCodecRoundTrip(t *testing.T) {
	m, r, h, d := sampleRecords()
	if got, err := decodeMessage(m.ID, encodeMessage(&m)); err != nil || !reflect.DeepEqual(got, m) {
		t.Errorf("message: %+v, %v", got, err)
	}
	if got, err := decodeRecipient(r.Key, encodeRecipient(&r)); err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("recipient: %+v, %v", got, err)
	}
	if got, err := decodeHistory(encodeHistory(h)); err != nil || !reflect.DeepEqual(got, h) {
		t.Errorf("history: %+v, %v", got, err)
	}
	if got, err := decodeDestination(encodeDestination(&d)); err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("destination: %+v, %v", got, err)
	}
	var zero Recipient
	zero.Status = Queued
	if got, err := decodeRecipient(Key{}, encodeRecipient(&zero)); err != nil || !got.NextAttempt.IsZero() {
		t.Errorf("zero times must stay zero: %+v, %v", got, err)
	}
}

func TestCodecRejectsDamage(t *testing.T) {
	_, r, _, _ := sampleRecords()
	good := encodeRecipient(&r)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{2}, good[1:]...),
		"status":    append([]byte{1, 99}, good[2:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"length":    {1, 1, 0xff, 0x01},
	} {
		if _, err := decodeRecipient(Key{}, b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", name, err)
		}
	}
}

func TestTimeKeyClamps(t *testing.T) {
	for _, tc := range []struct {
		t    time.Time
		want uint64
	}{
		{time.Time{}, 0},
		{time.Unix(-5, 0), 0},
		{time.Unix(0, 5), 5},
		{time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC), math.MaxInt64},
	} {
		k := timeKey(tc.t)
		var got uint64
		for _, b := range k {
			got = got<<8 | uint64(b)
		}
		if got != tc.want {
			t.Errorf("timeKey(%v) = %d, want %d", tc.t, got, tc.want)
		}
	}
}

// FuzzDecode feeds arbitrary bytes to every record decoder. A decoder must
// never panic and must either fail with errCorrupt or return a value that
// survives an encode/decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	m, r, h, d := sampleRecords()
	for _, b := range [][]byte{encodeMessage(&m), encodeRecipient(&r), encodeHistory(h),
		encodeDestination(&d), {}, {1}, {1, 0}, {1, 5, 0xff}} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(name string, v any, err error, again func() (any, error)) {
			if err != nil {
				if !errors.Is(err, errCorrupt) {
					t.Fatalf("%s: error %v does not wrap errCorrupt", name, err)
				}
				return
			}
			v2, err := again()
			if err != nil || !reflect.DeepEqual(v, v2) {
				t.Fatalf("%s: round trip: %+v vs %+v (%v)", name, v, v2, err)
			}
		}
		if x, err := decodeMessage(1, b); true {
			check("message", x, err, func() (any, error) { return decodeMessage(1, encodeMessage(&x)) })
		}
		if x, err := decodeRecipient(Key{1, 1}, b); true {
			check("recipient", x, err, func() (any, error) { return decodeRecipient(Key{1, 1}, encodeRecipient(&x)) })
		}
		if x, err := decodeHistory(b); true {
			check("history", x, err, func() (any, error) { return decodeHistory(encodeHistory(x)) })
		}
		if x, err := decodeDestination(b); true {
			check("destination", x, err, func() (any, error) { return decodeDestination(encodeDestination(&x)) })
		}
	})
}
