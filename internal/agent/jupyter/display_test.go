package jupyter

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// An update of a display is held to the cell's cap on results as a new
// result is: one over it leaves the display as it was.
func TestDisplayUpdatesStayWithinTheCap(t *testing.T) {
	r := newRun(DefaultOutputCap)
	send := func(kind, text string) {
		c, _ := json.Marshal(map[string]any{
			"data":      map[string]string{"text/plain": text},
			"transient": map[string]string{"display_id": "d1"},
		})
		r.handle("iopub", &message{Header: header{MsgType: kind}, Content: c})
	}
	send("display_data", "start")
	send("update_display_data", "step 1")
	if len(r.exec.Results) != 1 || r.exec.Results[0].Text != "step 1" {
		t.Fatalf("after an update: %+v", r.exec.Results)
	}
	send("update_display_data", strings.Repeat("x", ResultsCap+1))
	if len(r.exec.Results) != 1 || r.exec.Results[0].Text != "step 1" || r.resultsBytes > ResultsCap {
		t.Errorf("an update over the cap: %d results, %d bytes counted", len(r.exec.Results), r.resultsBytes)
	}
}

// A result whose forms together pass the cell's cap keeps its text (and
// its main place) and what fits, its largest forms left out with a note;
// one whose text alone does not fit is dropped with the marker.
func TestLargeResultKeepsWhatFits(t *testing.T) {
	r := newRun(DefaultOutputCap)
	big := strings.Repeat("p", 20<<20)
	r.mu.Lock()
	r.onResult(agentproto.Result{IsMainResult: true, Text: "<PIL.Image.Image image mode=RGB size=3000x3000>", PNG: big, JPEG: strings.Repeat("j", 15<<20)})
	r.mu.Unlock()
	e := r.execution(time.Now())
	if len(e.Results) != 1 || !e.Results[0].IsMainResult || e.Results[0].PNG != "" || len(e.Results[0].JPEG) != 15<<20 {
		t.Fatalf("results %d, first main %v png %d jpeg %d", len(e.Results), len(e.Results) > 0 && e.Results[0].IsMainResult, len(e.Results[0].PNG), len(e.Results[0].JPEG))
	}
	if !strings.HasPrefix(e.Text, "<PIL.Image.Image") || !strings.Contains(e.Text, "image/png form left out") {
		t.Errorf("text %q", e.Text)
	}
	r.mu.Lock()
	r.onResult(agentproto.Result{Text: strings.Repeat("t", ResultsCap)})
	r.mu.Unlock()
	if e := r.execution(time.Now()); len(e.Results) != 2 || !strings.HasPrefix(e.Results[1].Text, "[results truncated") {
		t.Errorf("a text over the cap: %d results", len(e.Results))
	}
}
