package jupyter

import (
	"encoding/json"
	"strings"
	"testing"
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
