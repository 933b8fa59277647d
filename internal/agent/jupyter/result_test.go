package jupyter

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestToResultStructuredData checks that the template extension's MIME types
// land in Chart and Data, decoded, and nowhere else.
func TestToResultStructuredData(t *testing.T) {
	data := map[string]json.RawMessage{
		"text/plain":          json.RawMessage(`"<Figure>"`),
		"image/png":           json.RawMessage(`"iVBO\nRw=="`),
		agentproto.ChartMIME:  json.RawMessage(`{"type":"line","elements":[{"label":"a","points":[[1,2]]}]}`),
		agentproto.TableMIME:  json.RawMessage(`{"columns":["a"],"rows":[[1]]}`),
		"application/x-other": json.RawMessage(`{"k":1}`),
	}
	res := toResult(data, false)
	if res.PNG != "iVBORw==" || res.Text != "<Figure>" {
		t.Fatalf("png %q text %q", res.PNG, res.Text)
	}
	wantChart := map[string]any{"type": "line", "elements": []any{map[string]any{"label": "a", "points": []any{[]any{1.0, 2.0}}}}}
	if !reflect.DeepEqual(res.Chart, wantChart) {
		t.Fatalf("chart %#v", res.Chart)
	}
	if !reflect.DeepEqual(res.Data, map[string]any{"columns": []any{"a"}, "rows": []any{[]any{1.0}}}) {
		t.Fatalf("data %#v", res.Data)
	}
	if len(res.Extra) != 1 || res.Extra["application/x-other"] == nil {
		t.Fatalf("extra %#v", res.Extra)
	}
	b, _ := json.Marshal(res)
	var back map[string]any
	json.Unmarshal(b, &back)
	if back["chart"] == nil || back["data"] == nil {
		t.Fatalf("wire form %s", b)
	}
}
