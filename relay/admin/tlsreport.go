package admin

import (
	"context"
	"encoding/json"
	"net/http"

	"go.uber.org/zap"
)

// tlsReport sends the TLS reports now (POST /api/tls-report/send).
func (s *Server) tlsReport(w http.ResponseWriter, r *http.Request) {
	res, err := s.opt.TLSReport(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, err)
		return
	}
	s.log.Info("TLS reports sent by the operator", zap.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, res)
}

// TLSReportSend asks the relay to send its TLS reports now and returns
// the API's JSON answer.
func (c *Client) TLSReportSend(ctx context.Context) (json.RawMessage, error) {
	var res json.RawMessage
	err := c.getJSON(ctx, http.MethodPost, "/api/tls-report/send", nil, &res)
	return res, err
}
