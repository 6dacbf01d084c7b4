package classifier

import (
	"fmt"

	"github.com/greyrelay/greyrelay/internal/smtpvocab"
)

// Fault names the side that is usually responsible for a failure.
type Fault string

// Faults. "relay" is greyrelay itself: its IP, DNS names, TLS or credentials.
const (
	FaultSender          Fault = "sender"
	FaultRecipientServer Fault = "recipient-server"
	FaultRelay           Fault = "relay"
	FaultNetwork         Fault = "network"
	FaultUnknown         Fault = "unknown"
	FaultOperator        Fault = "operator" // the relay's operator acted; nobody is at fault
)

// Explanation tells an operator what a verdict means and what to do.
type Explanation struct {
	Meaning string // one sentence
	Fault   Fault  // who is usually at fault
	Action  string // what to do
}

// String renders the explanation as one paragraph.
func (e Explanation) String() string {
	return fmt.Sprintf("%s Usually at fault: %s. %s", e.Meaning, e.Fault, e.Action)
}

// commonAdvice applies to every delivery problem.
const commonAdvice = "Read the enhanced code, decide which side is misconfigured, test the destination's MX path " +
	"(greyrelay probe), keep the sending IP stable, check the IP's reputation if deferrals persist, " +
	"and split transactions per domain."

// Explain returns the catalogue entry for a reason and an enhanced code
// ("" if none); pass Verdict.Status() so that the class matches what
// greyrelay did. The most specific entry wins: the exact code regardless of
// class ("X.3.5"), then its subject ("X.3.x"), then the reason, then generic
// advice. Greylisting and rate limiting are the exception: servers report
// them under arbitrary codes (postgrey 4.2.0, rspamd 4.7.1, Gmail 4.2.1), so
// for them the reason comes first. A class 4 or 5 adds what greyrelay does.
//
// An operator's action (the Operator* reasons) is explained as itself, whatever
// the last reply was: that reply came from an earlier attempt, and its
// class says nothing of what greyrelay does now.
func Explain(reason Reason, enhanced string) Explanation {
	if x, ok := explainOperator(reason); ok {
		return x
	}
	x, e, ok := entry(reason, enhanced)
	switch {
	case ok && e[0] == 4:
		x.Action += " Class 4 (temporary): greyrelay keeps retrying until the message expires."
	case ok && e[0] == 5:
		x.Action += " Class 5 (permanent): greyrelay returns the message to its sender with a DSN."
	}
	return x
}

// ExplainExpired explains the last deferral of a recipient whose lifetime
// ran out (status 4.4.7): the entry Explain would choose, but saying that
// greyrelay gave up, where Explain's class 4 note would promise retries
// that no longer happen.
func ExplainExpired(reason Reason, enhanced string) Explanation {
	x, _, _ := entry(reason, enhanced)
	x.Action += " The problem was temporary, but it lasted until the message expired: greyrelay gave up, " +
		"returned the message to its sender and no longer retries."
	return x
}

// explainOperator explains an operator's action.
func explainOperator(reason Reason) (Explanation, bool) {
	const earlier = " The last reply shown, if any, is from an earlier attempt."
	x := Explanation{Fault: FaultOperator}
	switch reason {
	case OperatorBounced:
		x.Meaning = "The relay's operator returned this message to its sender (greyrelay queue bounce) before it could be delivered." + earlier
		x.Action = "greyrelay sent the sender a DSN and no longer tries this recipient. If that was not expected, ask the relay's operator why."
	case OperatorHeld:
		x.Meaning = "The relay's operator put this recipient on hold (greyrelay queue hold): greyrelay makes no attempt to deliver it while it is held." + earlier
		x.Action = "Release it (greyrelay queue release) to have it delivered, or bounce or delete it."
	case OperatorReleased:
		x.Meaning = "The relay's operator released this recipient from hold (greyrelay queue release): it was due at once and is delivered as usual." + earlier
		x.Action = "Nothing to do; the outcome of its next attempt replaces this."
	case Suppressed:
		x.Meaning = "The address is on the relay's suppression list: an earlier message to it failed permanently for a reason about the address (or the operator put it there), so greyrelay does not try it again. It refuses it at RCPT (suppression.action refuse) or accepts it and returns it at once with a DSN (suppression.action bounce)."
		x.Action = "Stop mailing this address; if it works again, the relay's operator takes it off the list (greyrelay suppression remove)."
		x.Fault = FaultSender
	case OperatorDeleted:
		x.Meaning = "The relay's operator deleted this recipient (greyrelay queue delete): greyrelay no longer tries it, and its sender was not told (no DSN)."
		x.Action = "If that was not expected, ask the relay's operator why; the sender may have to send the message again."
	default:
		return Explanation{}, false
	}
	return x, true
}

// entry finds the catalogue entry for a reason and an enhanced code (see
// Explain), and returns the parsed code.
func entry(reason Reason, enhanced string) (Explanation, [3]int, bool) {
	var keys []string
	if reason == Greylisted || reason == RateLimited {
		keys = append(keys, string(reason))
	}
	e, ok := smtpvocab.ParseEnhanced(enhanced)
	if ok && e[1] != 0 { // X.0.x says nothing beyond the class
		keys = append(keys, fmt.Sprintf("X.%d.%d", e[1], e[2]), fmt.Sprintf("X.%d.x", e[1]))
	}
	keys = append(keys, string(reason))
	x, _ := catalogue("generic")
	for _, k := range keys {
		if found, hit := catalogue(k); hit {
			x = found
			break
		}
	}
	return x, e, ok
}

// catalogue holds the explanations, keyed by "X.<subject>.<detail>",
// "X.<subject>.x", a Reason, or "generic". RFC 3463 §3 defines the subjects.
func catalogue(key string) (Explanation, bool) {
	e := func(f Fault, meaning, action string) (Explanation, bool) {
		return Explanation{meaning, f, action}, true
	}
	switch key {
	// X.1.x: addressing.
	case "X.1.1":
		return e(FaultSender, "The recipient's mailbox does not exist on the receiving server.", "Check the address for typos and ask the recipient for a working one; retrying will not help.")
	case "X.1.2":
		return e(FaultSender, "The recipient's domain does not exist or has no mail server.", "Check the domain's spelling; if it is right, the domain's DNS is broken and only its owner can fix it.")
	case "X.1.3":
		return e(FaultSender, "The recipient address is not syntactically valid.", "Correct the address, and check any client that rewrites addresses before they reach greyrelay.")
	case "X.1.6":
		return e(FaultSender, "The mailbox has moved and no longer receives mail at this address.", "Ask the recipient for the new address.")
	case "X.1.7":
		return e(FaultSender, "The receiver rejected the envelope sender address as malformed.", "Check the MAIL FROM address the submitting client uses and any rewriting configured in greyrelay.")
	case "X.1.8":
		return e(FaultSender, "The receiver could not verify the envelope sender's domain (no MX or address records).", "Make sure the sender domain resolves in public DNS with MX or A/AAAA records.")
	case "X.1.10":
		return e(FaultSender, "The recipient domain publishes a null MX (RFC 7505) and accepts no mail; Microsoft also uses this code for a recipient that does not exist.", "Check the address and ask the recipient for a working one; retrying will not help.")
	case "X.1.x":
		return e(FaultSender, "The receiver rejected an envelope address as invalid.", "Check both envelope addresses for typos and their domains' DNS.")
	// X.2.x: mailbox.
	case "X.2.0":
		return e(FaultRecipientServer, "Something is wrong with the recipient's mailbox; the code gives no detail.", "Read the reply text, and tell the recipient by another channel if it persists.")
	case "X.2.1":
		return e(FaultRecipientServer, "The recipient's mailbox is disabled and not accepting messages.", "Tell the recipient by another channel; the account may be suspended or closed.")
	case "X.2.2":
		return e(FaultRecipientServer, "The recipient's mailbox is full; nothing is wrong with the message.", "The recipient must free space; tell them by another channel if it lasts.")
	case "X.2.3":
		return e(FaultSender, "The message is larger than the recipient's mailbox accepts.", "Send a smaller message, for example with large attachments shared as links.")
	case "X.2.x":
		return e(FaultRecipientServer, "The recipient's mailbox has a problem (disabled, full or restricted).", "Contact the recipient by another channel with the reply text.")
	// X.3.x: mail system.
	case "X.3.0", "X.3.x":
		return e(FaultRecipientServer, "The receiving mail system failed internally; nothing is wrong with the message.", "If it lasts past a day, contact the recipient's postmaster with the reply text and time.")
	case "X.3.1":
		return e(FaultRecipientServer, "The receiving mail system is out of disk space or other resources.", "Nothing to change on our side; if it lasts past a day, notify the recipient's postmaster.")
	case "X.3.2":
		return e(FaultRecipientServer, "The receiving system is not accepting mail right now (maintenance, overload or a connection filter).", "If it persists, test the MX path with greyrelay probe and contact the recipient's postmaster.")
	case "X.3.4":
		return e(FaultSender, "The message is larger than the receiving system accepts.", "Send a smaller message; greyrelay probe shows the SIZE limit the server advertises.")
	case "X.3.5":
		return e(FaultRecipientServer, "The receiving system is misconfigured; nothing is wrong with the message.", "If it lasts past a day, contact the recipient's postmaster with the reply text and time.")
	// X.4.x: network and routing.
	case "X.4.1":
		return e(FaultNetwork, "The receiving host did not answer: the connection was refused, timed out or dropped.", "Test the MX path with greyrelay probe and check that outbound port 25 is open from the sending IP.")
	case "X.4.2":
		return e(FaultNetwork, "The connection broke or timed out during the SMTP dialogue.", "If it repeats, probe the MX with greyrelay probe and look for packet loss or middleboxes on the path.")
	case "X.4.3":
		return e(FaultNetwork, "A DNS lookup for the destination failed temporarily.", "Check greyrelay's resolver and the domain's name servers (dig MX).")
	case "X.4.4":
		return e(FaultRecipientServer, "There is no route to the destination: the domain has no usable MX or address.", "Check the domain's MX and A/AAAA records; only the domain owner can fix them.")
	case "X.4.5":
		return e(FaultRecipientServer, "The receiving system is congested or limits how much it accepts.", "Nothing is wrong with the message; keep the volume per destination moderate.")
	case "X.4.6":
		return e(FaultRecipientServer, "Mail for this destination loops between servers.", "Check greyrelay's static routes and the destination's MX and forwarding; one side sends mail back to the other.")
	case "X.4.7":
		return e(FaultUnknown, "The message could not be delivered before its queue lifetime expired.", "The last deferral reason in the queue names the real cause; explain that one.")
	case "X.4.x":
		return e(FaultNetwork, "A network or routing problem stopped delivery.", "Test the destination's MX path with greyrelay probe.")
	// X.5.x: protocol.
	case "X.5.1", "X.5.2":
		return e(FaultRelay, "The receiver rejected one of our commands as invalid or malformed.", "Capture the dialogue with greyrelay probe; a middlebox may be rewriting commands.")
	case "X.5.3":
		return e(FaultRelay, "The transaction had more recipients than the receiver accepts.", "The remaining recipients are sent in a later transaction; lower the per-transaction recipient limit if it repeats.")
	case "X.5.4":
		return e(FaultSender, "The receiver rejected a command argument (an address or an extension parameter).", "Check the envelope addresses and the extensions the message needs (SIZE, 8BITMIME, SMTPUTF8).")
	case "X.5.x":
		return e(FaultUnknown, "The SMTP dialogue broke the protocol.", "Capture the dialogue with greyrelay probe and compare it with the reply text.")
	// X.6.x: media and content.
	case "X.6.7", "X.6.8", "X.6.9":
		return e(FaultRecipientServer, "The message needs SMTPUTF8 (RFC 6531: a non-ASCII address or UTF-8 header fields) and the next hop does not support it, so it cannot be passed on unchanged.",
			"Retrying will not help: send it again between all-ASCII addresses (ask the recipient for an ASCII alias), or ask the recipient's postmaster to enable SMTPUTF8.")
	case "X.6.x":
		return e(FaultSender, "The receiver refused the message's content or encoding.", "Check the message format: 8-bit content, encodings, and non-ASCII addresses (SMTPUTF8).")
	// X.7.x: security and policy.
	case "X.7.0", "X.7.x":
		return e(FaultUnknown, "The receiver refused delivery for a security or policy reason.", "Read the reply text; check the sending IP's reputation and the sender domain's SPF, DKIM and DMARC.")
	case "X.7.1":
		return e(FaultUnknown, "The receiver refused the sender or message under its policy (blocklist, relay denied, spam filter).", "Read the reply text; check the sending IP's reputation and the sender domain's SPF, DKIM and DMARC.")
	case "X.7.4", "X.7.10":
		return e(FaultRelay, "The receiver requires a security feature greyrelay did not use, usually TLS.", "Enable STARTTLS towards this destination in greyrelay's configuration.")
	case "X.7.5":
		return e(FaultUnknown, "TLS failed: the handshake, certificate verification or encryption did not succeed.", "Probe the MX with greyrelay probe to see the certificate; report a bad certificate to the recipient's postmaster or fix our trust settings.")
	case "X.7.8":
		return e(FaultRelay, "The server rejected greyrelay's authentication credentials.", "Fix the username or password configured for this smarthost.")
	case "X.7.11":
		return e(FaultRelay, "The server requires encryption before this authentication mechanism.", "Enable STARTTLS before AUTH for this smarthost.")
	case "X.7.25":
		return e(FaultRelay, "The sending IP's reverse DNS (PTR) is missing or does not match its name.", "Give the sending IP a PTR record whose name resolves back to it, and use that name in EHLO.")
	case "X.7.26":
		return e(FaultSender, "The message failed the receiver's sender authentication (SPF, DKIM, DMARC).", "Publish SPF covering the sending IP, sign with DKIM and align DMARC for the sender domain.")
	case "X.7.27":
		return e(FaultSender, "The envelope sender's domain publishes a null MX, so it cannot receive replies.", "Use an envelope sender whose domain accepts mail.")
	case "X.7.28":
		return e(FaultRelay, "The receiver saw an unusual rate or flood of mail from the sending IP.", "Slow down, check the sending IP's reputation and look for compromised accounts sending spam.")
	case "X.7.500":
		return e(FaultRelay, "Microsoft is throttling mail from this IP (server busy), typically because it has little reputation yet.", "Keep the sending IP stable and the volume low; if it lasts for days, check the IP's reputation.")
	// Reasons, for failures without a telling enhanced code.
	case string(Greylisted):
		return e(FaultRecipientServer, "The receiver greylists: it refuses mail from unfamiliar senders once and expects a retry.", "Nothing to fix: greyrelay retries from the same sending IP after the greylist delay; changing the IP restarts greylisting.")
	case string(RateLimited):
		return e(FaultRelay, "The receiver limits how fast it accepts mail from the sending IP.", "greyrelay backs off and retries; lower the volume per destination and check the IP's reputation if it lasts.")
	case string(MailboxFull):
		return catalogue("X.2.2")
	case string(ServerConfig):
		return catalogue("X.3.5")
	case string(ServerError):
		return catalogue("X.3.0")
	case string(Policy):
		return catalogue("X.7.x")
	case string(NoSuchUser):
		return e(FaultSender, "The recipient address does not exist at the destination.", "Check the address for typos; retrying will not help.")
	case string(DNS):
		return e(FaultNetwork, "Looking up the destination's mail servers failed, or the domain accepts no mail.", "Run dig MX for the domain: NXDOMAIN or a null MX is final, other failures are retried.")
	case string(Connect):
		return catalogue("X.4.1")
	case string(TLS):
		return catalogue("X.7.5")
	case string(Timeout):
		return e(FaultNetwork, "The destination stopped answering within the time limit.", "If it repeats, probe the MX with greyrelay probe and check the path for packet loss.")
	case string(MessageTooBig):
		return catalogue("X.3.4")
	case string(SMTPUTF8Unsupported):
		return catalogue("X.6.7")
	case string(Protocol):
		return e(FaultRecipientServer, "The destination sent a reply greyrelay could not understand.", "Capture the dialogue with greyrelay probe and send it to the recipient's postmaster.")
	case string(Unknown):
		return e(FaultUnknown, "greyrelay could not classify this failure, so it treats it as temporary.", commonAdvice)
	case "generic":
		return e(FaultUnknown, "Delivery did not succeed.", commonAdvice)
	}
	return Explanation{}, false
}
