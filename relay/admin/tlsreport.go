package admin

import (
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
