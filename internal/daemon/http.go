package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/overlaynet/overlay/subnet"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultHealthAddr is where /healthz, /readyz, /metrics and /status are
// served (see subnet.DefaultHealthAddr).
const DefaultHealthAddr = subnet.DefaultHealthAddr

// serveHTTP serves the health endpoints on ln until ctx ends:
//
//	/healthz  200 while the process runs
//	/readyz   200 when every readiness condition holds, else 503 naming the failing ones
//	/metrics  Prometheus text format
//	/status   the Status document, as JSON: the peers' health summary and
//	          worst peers; every peer's record too with ?peers=all (at
//	          thousands of peers, megabytes)
func serveHTTP(ctx context.Context, ln net.Listener, p *probe, m *metrics, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		s := p.status(time.Now())
		var failing []string
		for _, c := range s.Conditions {
			if !c.OK {
				failing = append(failing, c.Name+": "+c.Reason)
			}
		}
		if len(failing) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%s\n", strings.Join(failing, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st := p.status(time.Now())
		st.PeerHealth = p.peerHealth(r.URL.Query().Get("peers") == "all")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("health endpoint stopped", "err", err)
	}
}
