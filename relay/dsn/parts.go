package dsn

import (
	"bytes"
	"mime/quotedprintable"
	"strings"
)

// statusPart builds the machine-readable part (RFC 3464 §2): the
// per-message fields, then one block per recipient, each block preceded by
// a blank line.
func statusPart(r Report, host string) part {
	global := r.UTF8
	var b strings.Builder
	b.WriteString(field("Reporting-MTA", "dns; "+host))
	if id := oneLine(r.EnvID, !global); id != "" {
		b.WriteString(field("Original-Envelope-Id", id))
	}
	if !r.Arrival.IsZero() {
		b.WriteString(field("Arrival-Date", date(r.Arrival)))
	}
	for _, rc := range r.Recipients {
		b.WriteString("\r\n")
		b.WriteString(recipientFields(rc, global))
	}
	p := part{body: []byte(b.String())}
	if global {
		// RFC 6533 §6.4: message/global-delivery-status may carry UTF-8.
		p.header = "Content-Type: message/global-delivery-status\r\n" + eightBit(p.body)
	} else {
		p.header = "Content-Type: message/delivery-status\r\n"
	}
	p.header += "Content-Description: Delivery report\r\n"
	return p
}

// recipientFields renders one per-recipient block (RFC 3464 §2.3).
func recipientFields(rc Recipient, global bool) string {
	var b strings.Builder
	if rc.Original != "" {
		if v := originalRecipient(rc.Original, global); v != "" {
			b.WriteString(field("Original-Recipient", v))
		}
	}
	b.WriteString(field("Final-Recipient", typedAddr(cleanAddr(rc.Final), global)))
	b.WriteString(field("Action", string(rc.Action)))
	b.WriteString(field("Status", status(rc)))
	if h := cleanHost(rc.RemoteMTA); h != "" {
		b.WriteString(field("Remote-MTA", "dns; "+h))
	}
	// RFC 3464 §2.3.6: the reply text verbatim, typed "smtp"; outside
	// message/global-delivery-status it must be ASCII (RFC 6533 §3).
	if d := oneLine(rc.Diagnostic, !global); d != "" {
		b.WriteString(field("Diagnostic-Code", "smtp; "+d))
	}
	if !rc.LastAttempt.IsZero() {
		b.WriteString(field("Last-Attempt-Date", date(rc.LastAttempt)))
	}
	if rc.Action == Delayed && !rc.WillRetryUntil.IsZero() {
		b.WriteString(field("Will-Retry-Until", date(rc.WillRetryUntil)))
	}
	return b.String()
}

// eightBit returns a Content-Transfer-Encoding header for body if it holds
// 8-bit data, and "" (7bit, the default) otherwise.
func eightBit(body []byte) string {
	if isASCII(body) {
		return ""
	}
	return "Content-Transfer-Encoding: 8bit\r\n"
}

// textPart wraps the human-readable text. Short ASCII lines go as 7bit;
// anything else (non-ASCII replies, very long lines) is quoted-printable
// UTF-8, which keeps the part 7-bit clean with lines of at most 76 octets.
func textPart(text string) part {
	p := part{header: "Content-Type: text/plain; charset=utf-8\r\n"}
	plain := isASCII(text)
	for _, l := range strings.Split(text, "\r\n") {
		plain = plain && len(l) <= maxWord
	}
	if plain {
		p.body = []byte(text)
	} else {
		var b bytes.Buffer
		w := quotedprintable.NewWriter(&b)
		w.Write([]byte(text)) // writes to a bytes.Buffer cannot fail
		w.Close()
		p.body = b.Bytes()
		p.header += "Content-Transfer-Encoding: quoted-printable\r\n"
	}
	p.header += "Content-Description: Notification\r\n"
	return p
}

// humanText is the explanation for the sender: what happened to which
// recipient, the remote server's reply, and what to do about it.
func humanText(r Report, host, note string) string {
	out := []string{"This is the mail delivery system at " + host + ".", ""}
	out = append(out, wrap(intro(r.Recipients[0].Action, r.Recipients), "", 72)...)
	for _, rc := range r.Recipients {
		out = append(out, "")
		out = append(out, recipientText(rc)...)
	}
	out = append(out, "")
	if !r.Arrival.IsZero() {
		out = append(out, "Your message arrived here on "+date(r.Arrival)+".")
	}
	if note != "" {
		out = append(out, wrap(note, "", 72)...)
	}
	return strings.Join(out, "\r\n") + "\r\n"
}

// intro is the opening paragraph for a DSN about action.
func intro(a Action, rcpts []Recipient) string {
	switch a {
	case Failed:
		return failedIntro(rcpts)
	case Delayed:
		return "Your message has not yet been delivered to the recipients listed below. " +
			"This is only a warning: the mail system keeps trying, so you do not need " +
			"to send the message again. You will be told if it finally fails."
	case Relayed:
		return "Your message was passed on to the mail systems of the recipients listed " +
			"below. Those systems do not confirm delivery, so this is the last notice " +
			"you will get about it."
	default:
		return "Your message was delivered to the recipients listed below."
	}
}

// failedIntro opens a failure DSN. A failure with a class 4 status is an
// expiry (4.4.7): the problem was temporary but outlasted the queue
// lifetime, so it is not called a permanent error.
func failedIntro(rcpts []Recipient) string {
	expired := 0
	for _, rc := range rcpts {
		if strings.HasPrefix(rc.Status, "4.") {
			expired++
		}
	}
	switch expired {
	case 0:
		return "Your message could not be delivered to the recipients listed below. " +
			"This is a permanent error: the mail system has given up and will not try again."
	case len(rcpts):
		return "Your message could not be delivered to the recipients listed below before its time " +
			"in the queue ran out. The mail system kept trying while the problem lasted, has now " +
			"given up and will not try again."
	default:
		return "Your message could not be delivered to the recipients listed below. " +
			"The mail system has given up and will not try again; the note for each recipient says why."
	}
}

// recipientText is one recipient's paragraph of the human part.
func recipientText(rc Recipient) []string {
	out := []string{"<" + cleanAddr(rc.Final) + ">"}
	if h := cleanHost(rc.RemoteMTA); h != "" {
		out = append(out, "    Remote server: "+h)
	}
	if reply := lines(rc.Diagnostic); len(reply) > 0 {
		out = append(out, "    The remote server replied:")
		for _, l := range reply {
			out = append(out, "        "+l)
		}
	}
	out = append(out, "    Status: "+status(rc))
	if rc.Action == Delayed && !rc.WillRetryUntil.IsZero() {
		out = append(out, "    We will keep trying until "+date(rc.WillRetryUntil)+".")
	}
	if e := oneLine(rc.Explanation, false); e != "" {
		out = append(out, wrap(e, "    ", 72)...)
	}
	return out
}

// wrap breaks one line of text into lines of about width octets, each
// starting with indent. Words longer than width stay whole.
func wrap(text, indent string, width int) []string {
	var out []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(indent)+len(line)+1+len(w) > width {
			out = append(out, indent+line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		out = append(out, indent+line)
	}
	return out
}
