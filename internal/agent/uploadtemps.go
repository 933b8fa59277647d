package agent

import (
	"strings"
	"sync"
	"time"
)

// An upload writes a temp file beside its destination and renames it into
// place (putFile). A watch of the directory leaves the temp file out and
// reports the upload as one change of the file itself: a create, or a
// write when it replaced a file. uploadTemps tells the watch which.

// uploadTempMark is in the name of every upload's temp file:
// .NAME.upload-DIGITS.
const uploadTempMark = ".upload-"

// isUploadTemp says whether a file name is that of an upload's temp file.
func isUploadTemp(name string) bool {
	i := strings.LastIndex(name, uploadTempMark)
	if !strings.HasPrefix(name, ".") || i < 1 {
		return false
	}
	digits := name[i+len(uploadTempMark):]
	return digits != "" && strings.Trim(digits, "0123456789") == ""
}

// uploadTempTTL is how long an upload's temp file is remembered: a watch
// reads its events well within it.
const uploadTempTTL = time.Minute

// uploadTemps are the uploads' temp files of late, by name, with whether
// each replaces a file.
type uploadTemps struct {
	mu sync.Mutex
	m  map[string]uploadTemp
}

type uploadTemp struct {
	replaces bool
	at       time.Time
}

// add records the temp file name of an upload; it forgets those older
// than uploadTempTTL.
func (u *uploadTemps) add(name string, replaces bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	if u.m == nil {
		u.m = map[string]uploadTemp{}
	}
	for n, t := range u.m {
		if now.Sub(t.at) > uploadTempTTL {
			delete(u.m, n)
		}
	}
	u.m[name] = uploadTemp{replaces: replaces, at: now}
}

// replaces says whether the upload whose temp file is name replaced a
// file (false for one it does not know).
func (u *uploadTemps) replaces(name string) bool {
	if u == nil {
		return false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.m[name].replaces
}
