package tlsrpt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"

	"github.com/greyrelay/greyrelay/relay/smtpclient"
	"github.com/greyrelay/greyrelay/relay/tlspolicy"
)

// ResultType names, as RFC 8460 §4.3 does, why a TLS session under a
// policy failed. policyType decides the name of a generic verification
// failure: a DANE mismatch is tlsa-invalid (§4.3.2.1), a WebPKI failure
// under MTA-STS is one of the certificate-* types (§4.3.1).
func ResultType(policyType string, err error) string {
	var hostErr x509.HostnameError
	var certErr x509.CertificateInvalidError
	var authErr x509.UnknownAuthorityError
	switch {
	case errors.Is(err, tlspolicy.ErrDANEMismatch):
		return ResultTLSAInvalid
	case errors.As(err, &hostErr):
		return ResultHostMismatch
	case errors.As(err, &certErr) && certErr.Reason == x509.Expired:
		return ResultExpired
	case errors.As(err, &authErr):
		return ResultNotTrusted
	case errors.Is(err, smtpclient.ErrNoSTARTTLS):
		return ResultSTARTTLSNotSupported
	}
	return ResultValidationFailure
}

// STSResultType names why no MTA-STS policy could be had (RFC 8460
// §4.3.2.2): the policy host's certificate failed WebPKI validation, the
// policy did not parse, or the fetch failed.
func STSResultType(err *tlspolicy.FetchError) string {
	var verr *tls.CertificateVerificationError
	var authErr x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case err.Invalid:
		return ResultSTSPolicyInvalid
	case errors.As(err, &verr), errors.As(err, &authErr), errors.As(err, &hostErr):
		return ResultSTSWebPKIInvalid
	}
	return ResultSTSPolicyFetch
}
