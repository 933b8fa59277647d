package api

import (
	"strconv"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/metrics"
)

// apiMetrics are the API's series (docs/deploy.md, "Monitoring").
type apiMetrics struct {
	requests *metrics.Counter   // route, code (the HTTP status)
	seconds  *metrics.Histogram // route
	errors   *metrics.Counter   // code: the error code of an error answer
}

// Routes of requests no API pattern matched, as the route label says them.
const (
	routeUnmatched = "unmatched"  // no route: answered 404 or 405
	routeConsole   = "console"    // the web console's pages
	routePortProxy = "port_proxy" // a sandbox's port, by host name or with a port token
)

func newAPIMetrics(r *metrics.Registry) apiMetrics {
	return apiMetrics{
		requests: r.NewCounter("pandastack_http_requests_total",
			"HTTP requests answered, by route (the API's pattern, e.g. \"POST /v1/sandboxes/{id}/exec\", or console, port_proxy, unmatched) and status code.", "route", "code"),
		seconds: r.NewHistogram("pandastack_http_request_duration_seconds",
			"How long requests took, by route, until the handler returned: a streamed answer (exec, run_code, a terminal) counts until its end.", metrics.DurationBuckets, "route"),
		errors: r.NewCounter("pandastack_api_errors_total",
			"Error answers by their stable error code (the code field of the error body).", "code"),
	}
}

// request counts one request that took d.
func (a apiMetrics) request(route string, rec *statusRecorder, d time.Duration) {
	if a.requests == nil {
		return
	}
	a.requests.Inc(route, strconv.Itoa(rec.status))
	a.seconds.Observe(d.Seconds(), route)
	if rec.err != nil {
		a.errors.Inc(pandastack.ErrorCode(rec.err))
	}
}
