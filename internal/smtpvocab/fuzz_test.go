package smtpvocab

import (
	"strings"
	"testing"
)

// seedReplies are real replies from the classifier's tests.
var seedReplies = []string{
	"450 4.2.0 <alice@example.com>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/help/example.com.html",
	"450 4.7.1 <bob@example.org>: Recipient address rejected: Greylisted for 300 seconds (see http://isg.ee.ethz.ch/tools/postgrey/help/example.org.html)",
	"451 4.7.1 Try again later",
	"451 4.7.1 Try again later",
	"451 4.7.1 Greylisting in action, please come back in 00:05:00",
	"451 192.0.2.1 is not yet authorized to deliver mail from <a@example.net> to <b@example.org>. Please try later.",
	"451 Greylisted for 5 minutes (3)",
	"450 4.3.2 Service currently unavailable",
	"451 4.7.500 Server busy. Please try again later from [192.0.2.1]. (S77719) [DB5EUR03FT012.eop-EUR03.prod.protection.outlook.com]",
	"450 4.7.1 Graylisted, please retry in 2 minutes",
	"451 4.7.1 Temporarily deferred, please retry after 300 seconds",
	"450 Try again in 60s",
	"451 4.7.1 Greylisted, retry in 1 hour",
	"421-4.7.0 [192.0.2.1      15] Our system has detected an unusual rate of\n421-4.7.0 unsolicited mail originating from your IP address. To protect our\n421-4.7.0 users from spam, mail sent from your IP address has been temporarily\n421 4.7.0 rate limited. https://support.google.com/mail/answer/81126 a1si1 - gsmtp",
	"450-4.2.1 The user you are trying to contact is receiving mail at a rate that\n450-4.2.1 prevents additional messages from being delivered. Please resend your\n450-4.2.1 message at a later time. If the user is able to receive mail at that\n450-4.2.1 time, your message will be delivered. For more information, visit\n450 4.2.1  https://support.google.com/mail/?p=ReceivingRate a1si1 - gsmtp",
	"421 4.7.0 Try again later, closing connection. (EHLO) a1si1 - gsmtp",
	"421-4.7.28 [192.0.2.1] Our system has detected an unusual rate of unsolicited\n421 4.7.28 mail originating from your IP address. a1si1 - gsmtp",
	"421 4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume or user complaints - 4.16.55.1; see https://postmaster.yahooinc.com/error-codes",
	"451 4.7.650 The mail server [192.0.2.1] has been temporarily rate limited due to IP reputation. For e-mail delivery information, see https://aka.ms/postmaster (S775) []",
	"452 4.5.3 Too many recipients",
	"421 4.7.0 mx.example.org Error: too many connections from 192.0.2.1",
	"421 4.4.5 Server busy, try again later.",
	"550-5.7.28 [192.0.2.1] Our system has detected an unusual rate of unsolicited\n550 5.7.28 mail originating from your IP address. a1si1 - gsmtp",
	"552-5.2.2 The email account that you tried to reach is over quota. Please direct\n552 5.2.2 the recipient to https://support.google.com/mail/?p=OverQuotaPerm a1si1 - gsmtp",
	"552-5.2.2 The email account that you tried to reach is over quota. Please direct\n552 5.2.2 the recipient to https://support.google.com/mail/?p=OverQuotaPerm a1si1 - gsmtp",
	"452-4.2.2 The email account that you tried to reach is over quota. Please direct\n452 4.2.2 the recipient to https://support.google.com/mail/?p=OverQuotaTemp a1si1 - gsmtp",
	"552 5.2.2 <user@example.com> Quota exceeded (mailbox for user is full)",
	"552 Requested mail action aborted: exceeded storage allocation",
	"450 4.2.0 <u@example.com>: mailbox busy",
	"451 4.3.5 Server configuration error",
	"451 4.3.0 Error: queue file write error",
	"451 4.3.0 <bob@example.org>: Temporary lookup failure",
	"451 Requested action aborted: local error in processing",
	"452 4.3.1 Insufficient system storage",
	"451 4.7.0 Temporary server error. Please try again later. PRX4 [AM6PR0502MB3944.eurprd05.prod.outlook.com]",
	"451 Temporary local problem - please try later",
	"421 4.3.2 Service not available, closing transmission channel",
	"421 mx.example.org Service not available",
	"554 5.4.6 Too many hops",
	"554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org; https://www.spamhaus.org/query/ip/192.0.2.1",
	"550-5.7.26 This mail is unauthenticated, which poses a security risk to the\n550-5.7.26 sender and Gmail users, and has been blocked. The sender must\n550 5.7.26 authenticate with at least one of SPF or DKIM. a1si1 - gsmtp",
	"554 5.7.1 <bob@example.org>: Relay access denied",
	"550 5.7.1 Unfortunately, messages from [192.0.2.1] weren't sent. Please contact your Internet service provider since part of their network is on our block list (S3150).",
	"450 4.7.25 Client host rejected: cannot find your hostname, [192.0.2.1]",
	"550 5.7.25 [192.0.2.1] The IP address sending this message does not have a PTR record setup. a1si1 - gsmtp",
	"553 5.7.1 <a@example.net>: Sender address rejected: not logged in",
	"554 Transaction failed",
	"450 4.1.8 <a@example.net>: Sender address rejected: Domain not found",
	"535-5.7.8 Username and Password not accepted. For more information, go to\n535 5.7.8  https://support.google.com/mail/?p=BadCredentials a1si1 - gsmtp",
	"530 5.7.0 Authentication required",
	"550-5.1.1 The email account that you tried to reach does not exist. Please try\n550-5.1.1 double-checking the recipient's email address for typos or\n550-5.1.1 unnecessary spaces. For more information, go to\n550 5.1.1  https://support.google.com/mail/?p=NoSuchUser a1si1 - gsmtp",
	"550 5.1.1 <nobody@example.org>: Recipient address rejected: User unknown in local recipient table",
	"550 5.4.1 Recipient address rejected: Access denied. AS(201806281) [DB5EUR03FT012.eop-EUR03.prod.protection.outlook.com]",
	"550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup",
	"550 No such user here",
	"450 4.1.2 <x@nonexistent.example>: Recipient address rejected: Domain not found",
	"550 5.2.1 The email account that you tried to reach is disabled.",
	"552 5.3.4 Message size exceeds fixed limit",
	"552-5.3.4 Your message exceeded Google's message size limits. Please visit\n552-5.3.4  https://support.google.com/mail/?p=MaxSizeError to view our size\n552 5.3.4 guidelines. a1si1 - gsmtp",
	"552 Message size exceeds maximum permitted",
	"552 Requested mail action aborted",
	"553 5.6.7 local: peer does not support SMTPUTF8, required by this message (RFC 6531)",
	"553 5.6.7 Non-ASCII addresses not permitted for that sender/recipient",
	"550 5.6.9 UTF-8 header message cannot be transferred to one or more recipients",
	"554 5.6.0 Message content rejected",
	"454 4.7.0 TLS not available due to local problem",
	"530 5.7.0 Must issue a STARTTLS command first",
	"421 4.7.0 TLS required for RCPT domain, closing connection. a1si1 - gsmtp",
	"421 4.4.2 mx.example.org Error: timeout exceeded",
	"550 5.4.4 Unrouteable address",
	"500 5.5.1 Unrecognized command",
	"503 5.5.1 Error: need MAIL command",
	"501 5.1.7 Bad sender address syntax",
	"450 Requested mail action not taken: mailbox unavailable",
	"550 Requested action not taken: mailbox unavailable",
	"250 2.0.0 Ok",
	"999 nonsense",
}

func FuzzParseReply(f *testing.F) {
	for _, s := range seedReplies {
		f.Add(s)
	}
	f.Add("451-4.7.1 a\r\n451 4.7.1 b\r\n")
	f.Add("\x00\r\n\xff")
	f.Fuzz(func(t *testing.T, line string) {
		r, err := ParseReply(line)
		// The text is kept as sent, but lines were split at their CRLF.
		if strings.Contains(r.Text, "\r\n") || strings.ContainsAny(r.Error(), "\r\n\x00") {
			t.Fatalf("unsanitized reply %+v", r)
		}
		if err == nil && (r.Code < 200 || r.Code > 599) {
			t.Fatalf("code %d", r.Code)
		}
		if err != nil && r.Code != 0 {
			t.Fatalf("error with code %d", r.Code)
		}
		if r.Enhanced != "" && !validEnhanced(r.Enhanced) {
			t.Fatalf("bad enhanced %q", r.Enhanced)
		}
	})
}

func validEnhanced(s string) bool { _, ok := ParseEnhanced(s); return ok }

// enhancedPrefixSplit is enhancedPrefix as first written, with
// strings.Split: the reference the cutting one must agree with.
func enhancedPrefixSplit(text string, class int) (string, bool) {
	tok, _, _ := strings.Cut(text, " ")
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] != string(rune('0'+class)) {
		return "", false
	}
	for _, p := range parts[1:] {
		if len(p) < 1 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return "", false
		}
	}
	return tok, true
}

func FuzzEnhancedPrefix(f *testing.F) {
	for _, s := range []string{"2.0.0 Ok", "5.1.1", "4.7.1 x", "2.0 Ok", "2.0.0.0 x", "2..0 x", "2.1234.0", "2.a.0", "5.1.1x y", ""} {
		f.Add(s, 2)
		f.Add(s, 5)
	}
	f.Fuzz(func(t *testing.T, text string, class int) {
		got, ok := enhancedPrefix(text, class)
		want, wantOK := enhancedPrefixSplit(text, class)
		if got != want || ok != wantOK {
			t.Fatalf("enhancedPrefix(%q, %d) = %q, %v; by Split %q, %v", text, class, got, ok, want, wantOK)
		}
	})
}
