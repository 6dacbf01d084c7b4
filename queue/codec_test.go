package queue

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

func sampleRecords() (Message, Recipient, []Attempt, Destination) {
	at := time.Unix(0, t0.UnixNano())
	m := Message{ID: 7, From: "a@b", Arrival: at, Size: 1234, ClientAddr: "127.0.0.1:25",
		AuthUser: "u", Helo: "h", RET: "FULL", EnvID: "e", SMTPUTF8: true, DSN: true, RequireTLS: true,
		Tag: "order-confirmation", MessageID: "<m1@shop.example>"}
	r := Recipient{Key: Key{7, 2}, Addr: "ü@d", Domain: "d", Notify: "DELAY", ORCPT: "rfc822;x@d",
		Status: Deferred, Reason: "greylisted", Reply: Reply{451, "4.7.1", "later"}, Attempts: 3,
		NextAttempt: at.Add(time.Hour), FirstAttempt: at, LastAttempt: at.Add(time.Minute),
		FirstGreylisted: at, GreylistTries: 2, SourceIP: "::1", MXHost: "mx", MXAddr: "127.0.0.5",
		DelayWarnings: 1}
	h := []Attempt{{Start: at, End: at.Add(time.Second), SourceIP: "::1", MXHost: "mx", MXAddr: "a",
		Stage: "rcpt", Outcome: "deferred", Reason: "greylisted", Reply: Reply{450, "4.2.0", "x"}, TLS: "dane"},
		{Start: at, Outcome: outcomeInProgress}}
	d := Destination{Domain: "d", Greylists: true, GreylistSeen: 4, GreylistPassed: 3,
		LearnedDelay: 7 * time.Minute, LastGreylisted: at, ThrottleLevel: -1, ThrottledUntil: at,
		DeadHosts: map[string]time.Time{"mx1": at, "127.0.0.9": at.Add(time.Hour)},
		LastReply: Reply{421, "4.7.0", "busy"}, Updated: at, GreylistLow: 6 * time.Minute, GreylistProbes: 2,
		GreylistProbe: at.Add(time.Minute), PaceInterval: 1500 * time.Millisecond, PaceBase: time.Second, PaceRefusals: 2,
		GreylistChecked: at.Add(-time.Hour), PaceRun: 5, PaceRunStart: at.Add(-time.Minute),
		PaceRefused: at.Add(-time.Second), GreylistLearned: at.Add(-2 * time.Second)}
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
	for _, ref := range []Attempt{{}, historyRef(&r), h[0], h[1]} {
		if got, err := decodeHistory(Key{1, 1}, encodeHistory(Key{1, 1}, h, ref), ref); err != nil || !reflect.DeepEqual(got, h) {
			t.Errorf("history against %+v: %+v, %v", ref, got, err)
		}
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

// TestDestinationOldRecord decodes a destination record written before the
// greylisting window and the pace were added: they come back zero, the rest
// as stored.
func TestDestinationOldRecord(t *testing.T) {
	_, _, _, d := sampleRecords()
	d.GreyLike, d.GreyLikePassed, d.GreyLikeRefused = "Temporary local problem - please try later", 3, 1
	latest := encodeDestination(&d)
	if got, err := decodeDestination(latest); err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("latest record: %+v, %v; want %+v", got, err, d)
	}
	learned := newEnc()
	learned.t(d.GreylistLearned)
	latest = latest[:len(latest)-(len(learned.b)-len(newEnc().b))] // before GreylistLearned
	d.GreylistLearned = time.Time{}
	if got, err := decodeDestination(latest); err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("record without GreylistLearned: %+v, %v; want %+v", got, err, d)
	}
	refused := newEnc()
	refused.t(d.PaceRefused)
	latest = latest[:len(latest)-(len(refused.b)-len(newEnc().b))] // before PaceRefused
	d.PaceRefused = time.Time{}
	grey := newEnc()
	grey.s(d.GreyLike)
	grey.i(int64(d.GreyLikePassed))
	grey.i(int64(d.GreyLikeRefused))
	full := latest[:len(latest)-(len(grey.b)-len(newEnc().b))] // before GreyLike
	if got, err := decodeDestination(latest); err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("record without PaceRefused: %+v, %v; want %+v", got, err, d)
	}
	d.GreyLike, d.GreyLikePassed, d.GreyLikeRefused = "", 0, 0
	if got, err := decodeDestination(full); err != nil || !reflect.DeepEqual(got, d) {
		t.Errorf("record without GreyLike: %+v, %v; want %+v", got, err, d)
	}
	e := newEnc()
	e.i(int64(d.GreylistLow))
	e.i(int64(d.GreylistProbes))
	e.t(d.GreylistProbe)
	e.i(int64(d.PaceInterval))
	e.i(int64(d.PaceBase))
	e.i(int64(d.PaceRefusals))
	checked := newEnc()
	checked.t(d.GreylistChecked)
	checked.i(int64(d.PaceRun))
	checked.t(d.PaceRunStart)
	e.b = append(e.b, checked.b[len(newEnc().b):]...)
	old := full[:len(full)-(len(e.b)-len(newEnc().b))]
	got, err := decodeDestination(old)
	want := d
	want.GreylistLow, want.GreylistProbes, want.GreylistProbe = 0, 0, time.Time{}
	want.PaceInterval, want.PaceBase, want.PaceRefusals = 0, 0, 0
	want.GreylistChecked, want.PaceRun, want.PaceRunStart = time.Time{}, 0, time.Time{}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("old record: %+v, %v; want %+v", got, err, want)
	}
	// A record written with the pace but before the checks were timed
	// and the run counted.
	paced := full[:len(full)-(len(checked.b)-len(newEnc().b))]
	got, err = decodeDestination(paced)
	want = d
	want.GreylistChecked, want.PaceRun, want.PaceRunStart = time.Time{}, 0, time.Time{}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("record without GreylistChecked: %+v, %v; want %+v", got, err, want)
	}
	if _, err := decodeDestination(latest[:len(latest)-1]); err == nil {
		t.Error("a record cut inside the new fields decoded without error")
	}
}

func TestCodecRejectsDamage(t *testing.T) {
	_, r, _, _ := sampleRecords()
	good := encodeRecipient(&r)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{3}, good[1:]...),
		"status":    append([]byte{2, 99}, good[2:]...),
		"domain":    {2, 1, 0, 2, 'a', 'b', 1},
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"length":    {1, 1, 0xff, 0x01},
	} {
		if _, err := decodeRecipient(Key{}, b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: err = %v, want errCorrupt", name, err)
		}
	}
	for name, b := range map[string][]byte{
		"mask":        {2, 1, 0xff, 0x01},
		"address tag": {2, 1, sameStart | zeroEnd | sameMXHost | sameMXAddr | sameStage | sameReason | sameReply, 5},
		"outcome":     {2, 1, maskAll & 0xff, 99},
		"count":       {2, 9, maskAll & 0xff, 1},
	} {
		if _, err := decodeHistory(Key{1, 1}, b, Attempt{}); !errors.Is(err, errCorrupt) {
			t.Errorf("history %s: err = %v, want errCorrupt", name, err)
		}
	}
}

// Version 1 records, as greyrelay wrote them before version 2, still decode.
func TestCodecDecodesVersion1(t *testing.T) {
	_, r, h, _ := sampleRecords()
	h[0].TLS = "" // version 1 has no TLS policy
	e := newEncV(1)
	e.b = append(e.b, statusByte(r.Status))
	for _, v := range []string{r.Reason, r.Addr, r.Domain, r.Notify, r.ORCPT} {
		e.s(v)
	}
	e.reply(r.Reply)
	e.i(int64(r.Attempts))
	for _, v := range []time.Time{r.NextAttempt, r.FirstAttempt, r.LastAttempt, r.FirstGreylisted} {
		e.t(v)
	}
	e.i(int64(r.GreylistTries))
	e.s(r.SourceIP)
	e.s(r.MXHost)
	e.s(r.MXAddr)
	e.i(int64(r.DelayWarnings))
	if got, err := decodeRecipient(r.Key, e.b); err != nil || !reflect.DeepEqual(got, r) {
		t.Errorf("version 1 recipient: %+v, %v", got, err)
	}
	e = newEncV(1)
	e.u(uint64(len(h)))
	for _, a := range h {
		e.t(a.Start)
		e.t(a.End)
		for _, v := range []string{a.SourceIP, a.MXHost, a.MXAddr, a.Stage, a.Outcome, a.Reason} {
			e.s(v)
		}
		e.reply(a.Reply)
	}
	if got, err := decodeHistory(Key{1, 1}, e.b, historyRef(&r)); err != nil || !reflect.DeepEqual(got, h) {
		t.Errorf("version 1 history: %+v, %v", got, err)
	}
}

// TestMessageVersion2Decodes: a message record written before the tag and
// the Message-ID were kept decodes with them empty.
func TestMessageVersion2Decodes(t *testing.T) {
	m, _, _, _ := sampleRecords()
	m.Tag, m.MessageID = "", ""
	e := newEncV(2)
	e.s(m.From)
	e.t(m.Arrival)
	e.i(m.Size)
	for _, v := range []string{m.ClientAddr, m.AuthUser, m.Helo, m.RET, m.EnvID} {
		e.s(v)
	}
	e.u(flagSMTPUTF8 | flagDSN | flagRequireTLS)
	e.u(0)
	if got, err := decodeMessage(m.ID, e.b); err != nil || !reflect.DeepEqual(got, m) {
		t.Errorf("version 2 message: %+v, %v", got, err)
	}
}

// TestCodecIsCompact pins the sizes that matter at a million recipients: a
// deferred recipient and its one-attempt history as the scale benchmark
// stores them took 165 and 135 bytes in version 1 (and 4 bytes more each
// since they carry a checksum).
func TestCodecIsCompact(t *testing.T) {
	at := time.Unix(0, t0.UnixNano())
	r := Recipient{Addr: "user0001@slow.test", Domain: "slow.test", Status: Deferred, Reason: "server-error",
		Reply: Reply{451, "4.3.0", "Temporary local problem, please try again later"}, Attempts: 1,
		NextAttempt: at.Add(time.Hour), FirstAttempt: at, LastAttempt: at,
		SourceIP: "127.0.0.1", MXHost: "127.0.0.41", MXAddr: "127.0.0.41"}
	h := []Attempt{{Start: at, End: at.Add(time.Second), SourceIP: r.SourceIP, MXHost: r.MXHost, MXAddr: r.MXAddr,
		Stage: "mail", Outcome: string(Deferred), Reason: r.Reason, Reply: r.Reply}}
	if n := len(encodeRecipient(&r)); n > 139+sealSize {
		t.Errorf("recipient takes %d bytes", n)
	}
	if n := len(encodeHistory(Key{1, 1}, h, historyRef(&r))); n > 14+sealSize {
		t.Errorf("history takes %d bytes", n)
	}
}

// TestAddressCodec: addresses in canonical form are stored as bytes, the
// rest as text, and every string comes back as it went in.
func TestAddressCodec(t *testing.T) {
	for _, s := range []string{"", "127.0.0.1", "::1", "2001:db8::1", "::ffff:192.0.2.1", "fe80::1%eth0",
		"2001:DB8::1", "010.0.0.1", "mx.example", "1.2.3.4.5", string(make([]byte, 200))} {
		e := newEnc()
		e.addr(s)
		d := newDec(e.b)
		if got := d.addr(); got != s || d.done() != nil {
			t.Errorf("addr %q came back as %q (%v)", s, got, d.err)
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
	for _, b := range [][]byte{encodeMessage(&m), encodeRecipient(&r), encodeHistory(Key{1, 1}, h, Attempt{}),
		encodeHistory(Key{1, 1}, h, historyRef(&r)),
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
		for _, ref := range []Attempt{{}, historyRef(&r)} {
			if x, err := decodeHistory(Key{1, 1}, b, ref); true {
				check("history", x, err, func() (any, error) { return decodeHistory(Key{1, 1}, encodeHistory(Key{1, 1}, x, ref), ref) })
			}
		}
		if x, err := decodeDestination(b); true {
			check("destination", x, err, func() (any, error) { return decodeDestination(encodeDestination(&x)) })
		}
	})
}

// TestHistoryRoundTripRandom: histories of random attempts, with fields
// shared or not with their neighbours and the recipient, come back as
// they went in.
func TestHistoryRoundTripRandom(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	pick := func(vs ...string) string { return vs[rnd.IntN(len(vs))] }
	when := func() time.Time {
		if rnd.IntN(4) == 0 {
			return time.Time{}
		}
		return time.Unix(0, t0.UnixNano()+rnd.Int64N(4)*int64(time.Hour))
	}
	for range 500 {
		r := Recipient{LastAttempt: when(), SourceIP: pick("", "192.0.2.1", "::1"), MXHost: pick("mx", "192.0.2.9"),
			MXAddr: pick("192.0.2.9", "2001:db8::9"), Reason: pick("", "greylisted"),
			Reply: Reply{451, pick("", "4.7.1"), pick("", "later")}}
		h := make([]Attempt, rnd.IntN(6))
		for i := range h {
			h[i] = Attempt{Start: when(), End: when(), SourceIP: pick(r.SourceIP, "198.51.100.1"),
				MXHost: pick(r.MXHost, "mx2"), MXAddr: pick(r.MXAddr, "198.51.100.2"), Stage: pick("", "rcpt", "data"),
				Outcome: pick(outcomes[rnd.IntN(len(outcomes))], "odd"), Reason: pick(r.Reason, "timeout"),
				Reply: Reply{rnd.IntN(2) * 450, pick("", "4.7.1"), pick(r.Reply.Text, "other")}}
		}
		if len(h) == 0 {
			h = nil
		}
		ref := historyRef(&r)
		got, err := decodeHistory(Key{1, 1}, encodeHistory(Key{1, 1}, h, ref), ref)
		if err != nil || !reflect.DeepEqual(got, h) {
			t.Fatalf("round trip of %+v against %+v:\n got %+v, %v", h, ref, got, err)
		}
	}
}
