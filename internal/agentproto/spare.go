package agentproto

// SparesRequest (POST /v1/contexts/spares) asks the agent to keep Count
// kernels of Language started ahead of time, each with Warmup already run
// in it silently, and to hand one out on the next context create that fits
// (default cwd, no env), replacing it in the background. The call returns
// once Count spares are ready, so a checkpoint taken right after holds them.
// Count 0 stops keeping spares (the ready ones are shut down).
type SparesRequest struct {
	Language string `json:"language"`
	Count    int    `json:"count"`
	Warmup   string `json:"warmup,omitempty"`
}

// Spares describes the spare kernels of one language.
type Spares struct {
	Language string `json:"language"`
	Count    int    `json:"count"` // how many are kept
	Ready    int    `json:"ready"` // how many are ready now
}

// Released answers POST /v1/contexts/spares/release, which readies an idle
// sandbox for its suspend: its spare kernels are shut down, so the paused
// image does not hold them; they are started again after the resume (the
// host's hello) or on POST /v1/contexts/spares/refill.
type Released struct {
	Spares int `json:"spares"` // spare kernels shut down
}

// Held answers POST /v1/contexts/spares/hold?wait_ms=N, which readies a
// sandbox for a checkpoint that several sandboxes will restore (a fork): no
// spare kernel starts from then until as many DELETE
// /v1/contexts/spares/hold (or the next hello), and a start in flight is
// given up (its kernel killed), the call waiting up to N ms for that to
// end, so that the image holds no spare halfway through its start, which
// every child would then finish. With release=1 the ready spares are shut
// down too (their processes have exited when it answers): the image holds
// none, and the sandbox starts them again once the holds end.
type Held struct {
	Ready    int `json:"ready"`    // spare kernels ready, all languages (kept)
	Starting int `json:"starting"` // starts still in flight when the wait ended
	Released int `json:"released"` // ready spare kernels shut down (release=1)
}
