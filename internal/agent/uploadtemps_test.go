package agent

import "testing"

func TestIsUploadTemp(t *testing.T) {
	for name, want := range map[string]bool{
		".a.txt.upload-2508897208": true,
		".x.upload-1":              true,
		".upload-12":               false, // no name before the mark
		"a.txt.upload-12":          false, // not hidden
		".a.upload-":               false,
		".a.upload-12x":            false,
		".a.upload-12.upload-34":   true,
		"a.txt":                    false,
	} {
		if got := isUploadTemp(name); got != want {
			t.Errorf("isUploadTemp(%q) = %v, want %v", name, got, want)
		}
	}
	var u *uploadTemps
	if u.replaces("x") {
		t.Error("a nil record says an upload replaced a file")
	}
	u = &uploadTemps{}
	u.add(".a.upload-1", true)
	u.add(".b.upload-2", false)
	if !u.replaces(".a.upload-1") || u.replaces(".b.upload-2") || u.replaces(".c.upload-3") {
		t.Errorf("replaces: %v", u.m)
	}
}
