package s3_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/imagestore/imagestoretest"
	"github.com/pandastack/pandastack/internal/imagestore/s3"
	"github.com/pandastack/pandastack/internal/testutil"
)

const partSize = 5 << 20 // S3's smallest part: the suite's big file goes in 3

// harness runs the suite on a real versitygw: a bucket per test, and a
// fresh local cache for every store (every "server").
func harness(t *testing.T, srv *testutil.S3Server) imagestoretest.Harness {
	var mu sync.Mutex
	buckets := map[*testing.T]string{}
	bucket := func(t *testing.T) string {
		mu.Lock()
		defer mu.Unlock()
		if buckets[t] == "" {
			buckets[t] = srv.NewBucket(t)
		}
		return buckets[t]
	}
	return imagestoretest.Harness{
		New: func(t *testing.T) pandastack.ImageStore {
			return newStore(t, srv, bucket(t), t.TempDir())
		},
		Corrupt: func(t *testing.T, id, name string, data []byte) {
			p := filepath.Join(srv.Root, bucket(t), "snapshots", id, imagestore.FilesDir, name)
			if data == nil {
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		BigFile: 2*partSize + 12345,
	}
}

func newStore(t testing.TB, srv *testutil.S3Server, bucket, cache string) *s3.Store {
	t.Helper()
	s, err := s3.New(t.Context(), s3.Config{
		Endpoint: srv.Endpoint, Bucket: bucket, Prefix: "/snapshots/", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
		CacheDir: cache, PartSize: partSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestS3(t *testing.T) {
	srv := testutil.StartS3(t)
	imagestoretest.Run(t, harness(t, srv))

	// A damaged copy in one server's cache is dropped and fetched again.
	t.Run("DamagedCacheRefetched", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		cache := t.TempDir()
		s := newStore(t, srv, bucket, cache)
		id := putSample(t, s)
		os.WriteFile(filepath.Join(cache, id, imagestore.FilesDir, "f"), []byte("XXXX"), 0o600)
		img, err := s.Open(t.Context(), id)
		if err != nil {
			t.Fatalf("Open with a damaged cache copy: %v", err)
		}
		defer img.Close()
		if b, _ := os.ReadFile(filepath.Join(img.Dir(), imagestore.FilesDir, "f")); string(b) != "data" {
			t.Errorf("after refetch the file holds %q, want %q", b, "data")
		}
	})

	// A downloaded image's files keep the time it was made (the runtime
	// dates an image of an older build by its files).
	t.Run("DownloadKeepsTheImageTime", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		made := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
		root := t.TempDir()
		tmp := filepath.Join(root, "tmp")
		os.MkdirAll(filepath.Join(tmp, imagestore.FilesDir), 0o700)
		os.WriteFile(filepath.Join(tmp, imagestore.FilesDir, "checkpoint.img"), []byte("state"), 0o600)
		if _, err := imagestore.Seal(tmp, filepath.Join(root, "img"), imagestore.Manifest{Template: "base", CreatedAt: made}); err != nil {
			t.Fatal(err)
		}
		id := pandastack.NewID("snap")
		if _, err := newStore(t, srv, bucket, t.TempDir()).Put(t.Context(), id, filepath.Join(root, "img")); err != nil {
			t.Fatal(err)
		}
		img, err := newStore(t, srv, bucket, t.TempDir()).Open(t.Context(), id) // another node's cache: a download
		if err != nil {
			t.Fatal(err)
		}
		defer img.Close()
		st, err := os.Stat(filepath.Join(img.Dir(), imagestore.FilesDir, "checkpoint.img"))
		if err != nil || !st.ModTime().Equal(made) {
			t.Fatalf("the downloaded file's time: %v %v, want %v", st.ModTime(), err, made)
		}
	})

	// Past its size limit the cache evicts images nobody holds open.
	t.Run("CacheEviction", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		s, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, CacheDir: t.TempDir(), CacheMaxBytes: 6})
		if err != nil {
			t.Fatal(err)
		}
		a, b := putSample(t, s), putSample(t, s) // 4 bytes each
		if _, err := os.Stat(filepath.Join(s.CacheRoot(), a)); err == nil {
			t.Errorf("the older image %s is still cached past the limit", a)
		}
		held, err := s.Open(t.Context(), b)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		if img, err := s.Open(t.Context(), a); err != nil {
			t.Fatalf("Open of an evicted image (downloads it again): %v", err)
		} else {
			img.Close()
		}
		if _, err := os.Stat(held.Dir()); err != nil {
			t.Errorf("an image held open was evicted: %v", err)
		}
	})

	// A file over the part size goes up in parts; the rest in one request.
	t.Run("Multipart", func(t *testing.T) {
		rec := &recorder{next: http.DefaultTransport}
		s, err := s3.New(t.Context(), s3.Config{
			Endpoint: srv.Endpoint, Bucket: srv.NewBucket(t), AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
			CacheDir: t.TempDir(), PartSize: partSize, HTTPClient: &http.Client{Transport: rec},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(t.Context(), "snap_big", bigImage(t)); err != nil {
			t.Fatal(err)
		}
		parts, completes, plain := rec.count()
		if parts != 3 || completes != 1 || plain != 2 {
			t.Errorf("uploads: %d parts, %d completes, %d single PUTs; want 3, 1 and 2 (small + manifest)", parts, completes, plain)
		}
	})

	// An upload that breaks part way leaves no object and no image.
	t.Run("FailedUploadLeavesNothing", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		rec := &recorder{next: http.DefaultTransport, failPart: 2}
		s, err := s3.New(t.Context(), s3.Config{
			Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
			CacheDir: t.TempDir(), PartSize: partSize, HTTPClient: &http.Client{Transport: rec},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(t.Context(), "snap_broken", bigImage(t)); err == nil {
			t.Fatal("Put succeeded through a failing connection")
		}
		_, err = newStore(t, srv, bucket, t.TempDir()).Open(t.Context(), "snap_broken")
		if !pandastack.IsCode(err, pandastack.ENotFound) {
			t.Errorf("Open after a failed Put: %v, want not_found", err)
		}
		filepath.WalkDir(filepath.Join(srv.Root, bucket), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				t.Errorf("object left after a failed upload: %s", p)
			}
			return nil
		})
		if ents, _ := os.ReadDir(s.CacheRoot()); len(ents) != 0 {
			t.Errorf("the cache holds %d entries after a failed upload", len(ents))
		}
	})

	// What a server killed during an upload leaves (objects, and the parts
	// of an unfinished multipart upload) goes with a Delete of the id.
	t.Run("DeleteRemovesAnInterruptedUpload", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		s := newStore(t, srv, bucket, t.TempDir())
		raw := awss3.New(awss3.Options{
			Region: "us-east-1", BaseEndpoint: aws.String(srv.Endpoint), UsePathStyle: true,
			Credentials: credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, ""),
		})
		ctx := t.Context()
		key := func(name string) *string { return aws.String("snapshots/snap_cut/image/" + name) }
		if _, err := raw.PutObject(ctx, &awss3.PutObjectInput{Bucket: aws.String(bucket), Key: key("small"), Body: strings.NewReader("s")}); err != nil {
			t.Fatal(err)
		}
		up, err := raw.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: aws.String(bucket), Key: key("pages")})
		if err != nil {
			t.Fatal(err)
		}
		part := make([]byte, partSize)
		if _, err := raw.UploadPart(ctx, &awss3.UploadPartInput{Bucket: aws.String(bucket), Key: key("pages"), UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: bytes.NewReader(part)}); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "snap_cut"); err != nil {
			t.Fatal(err)
		}
		ups, err := raw.ListMultipartUploads(ctx, &awss3.ListMultipartUploadsInput{Bucket: aws.String(bucket)})
		if err != nil {
			t.Fatal(err)
		}
		if len(ups.Uploads) != 0 {
			t.Errorf("%d multipart uploads left after Delete", len(ups.Uploads))
		}
		objs, err := raw.ListObjectsV2(ctx, &awss3.ListObjectsV2Input{Bucket: aws.String(bucket)})
		if err != nil {
			t.Fatal(err)
		}
		if len(objs.Contents) != 0 {
			t.Errorf("%d objects left after Delete", len(objs.Contents))
		}
	})

	// A bucket that stops answering is a retryable sandbox_unavailable.
	t.Run("UnreachableIsUnavailable", func(t *testing.T) {
		down := &failing{next: http.DefaultTransport}
		bucket := srv.NewBucket(t)
		s, err := s3.New(t.Context(), s3.Config{
			Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
			CacheDir: t.TempDir(), HTTPClient: &http.Client{Transport: down},
		})
		if err != nil {
			t.Fatal(err)
		}
		down.down.Store(true)
		_, err = s.Put(t.Context(), "snap_x", sealFiles(t, map[string][]byte{"f": []byte("data")}))
		if !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Put: %v, want %s", err, pandastack.EUnavailable)
		}
		if _, err := s.Open(t.Context(), "snap_y"); !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Open: %v, want %s", err, pandastack.EUnavailable)
		}
		if err := s.Delete(t.Context(), "snap_y"); !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Delete: %v, want %s", err, pandastack.EUnavailable)
		}

		// A download cut in the middle of a body: retryable too, and
		// nothing of it stays in the cache.
		down.down.Store(false)
		if _, err := s.Put(t.Context(), "snap_z", sealFiles(t, map[string][]byte{"f": bytes.Repeat([]byte("data"), 1000)})); err != nil {
			t.Fatal(err)
		}
		cache := t.TempDir()
		cut := &failing{next: http.DefaultTransport}
		cut.cut.Store(true)
		other, err := s3.New(t.Context(), s3.Config{
			Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
			CacheDir: cache, HTTPClient: &http.Client{Transport: cut},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Open(t.Context(), "snap_z"); !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Open of a download cut short: %v, want %s", err, pandastack.EUnavailable)
		}
	})

	// A bucket that takes requests and then answers nothing, or stops in
	// the middle of a download, is given up after the stall timeout:
	// sandbox_unavailable, not a request that never ends.
	t.Run("StalledIsUnavailable", func(t *testing.T) {
		bucket := srv.NewBucket(t)
		stuck := &failing{next: http.DefaultTransport}
		cfg := s3.Config{
			Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
			CacheDir: t.TempDir(), HTTPClient: &http.Client{Transport: stuck}, StallTimeout: 300 * time.Millisecond,
		}
		s, err := s3.New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(t.Context(), "snap_s", sealFiles(t, map[string][]byte{"f": bytes.Repeat([]byte("data"), 1000)})); err != nil {
			t.Fatal(err)
		}
		stuck.hang.Store(true)
		// Without a deadline of the caller's, as a snapshot's upload and
		// delete run.
		ctx := context.WithoutCancel(t.Context())
		if _, err := s.Put(ctx, "snap_t", sealFiles(t, map[string][]byte{"f": []byte("data")})); !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "took nothing") {
			t.Errorf("Put to a bucket that answers nothing: %v, want %s saying it stalled", err, pandastack.EUnavailable)
		}
		if err := s.Delete(ctx, "snap_s"); !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Delete: %v, want %s", err, pandastack.EUnavailable)
		}
		stuck.hang.Store(false)
		stuck.stall.Store(true)
		cfg.CacheDir = t.TempDir()
		other, err := s3.New(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Open(ctx, "snap_s"); !pandastack.IsCode(err, pandastack.EUnavailable) {
			t.Errorf("Open of a download that stops: %v, want %s", err, pandastack.EUnavailable)
		}
		if left, _ := os.ReadDir(cfg.CacheDir); len(left) != 0 {
			t.Errorf("the cache holds %d entries after the stalled download", len(left))
		}
		// Once it answers again, so does the store: the image is whole.
		stuck.stall.Store(false)
		img, err := other.Open(ctx, "snap_s")
		if err != nil {
			t.Fatal(err)
		}
		img.Close()
	})

	t.Run("WrongCredentials", func(t *testing.T) {
		_, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.NewBucket(t), AccessKey: "nobody", SecretKey: "wrong", CacheDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
			t.Fatalf("New with an unknown key: %v, want the credentials named", err)
		}
		_, err = s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: srv.NewBucket(t), AccessKey: srv.AccessKey, SecretKey: "wrong", CacheDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "AWS_SECRET_ACCESS_KEY") {
			t.Fatalf("New with a wrong secret: %v, want the credentials named", err)
		}
	})
	t.Run("NoSuchBucket", func(t *testing.T) {
		_, err := s3.New(t.Context(), s3.Config{Endpoint: srv.Endpoint, Bucket: "absent", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, CacheDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "absent") || !strings.Contains(err.Error(), "no such bucket") {
			t.Fatalf("New on a missing bucket: %v", err)
		}
	})
}

// failing refuses every connection while down, as a bucket's host that
// went away.
type failing struct {
	next http.RoundTripper
	down atomic.Bool
	cut  atomic.Bool // bodies of object downloads end early, as when the server dies mid-transfer
	// hang: requests get no answer; stall: object downloads' bodies stop
	// after their first byte. Both until the request is given up.
	hang, stall atomic.Bool
}

func (f *failing) RoundTrip(req *http.Request) (*http.Response, error) {
	if f.down.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	if f.hang.Load() {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	resp, err := f.next.RoundTrip(req)
	download := err == nil && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/"+imagestore.FilesDir+"/")
	if download && f.cut.Load() {
		resp.Body = cutBody{resp.Body}
	}
	if download && f.stall.Load() {
		resp.Body = &stalledBody{ReadCloser: resp.Body, ctx: req.Context()}
	}
	return resp, err
}

// stalledBody gives a byte of its body, then nothing until its request
// is given up.
type stalledBody struct {
	io.ReadCloser
	ctx  context.Context
	gave bool
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if !b.gave && len(p) > 0 {
		b.gave = true
		return b.ReadCloser.Read(p[:1])
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

// cutBody gives a byte of its body, then io.ErrUnexpectedEOF, as Go's
// HTTP client does when the connection closes before the Content-Length.
type cutBody struct{ io.ReadCloser }

func (b cutBody) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	n, _ := b.ReadCloser.Read(p)
	if n > 0 {
		return n, nil
	}
	return 0, io.ErrUnexpectedEOF
}

// recorder counts the upload requests that pass through it.
type recorder struct {
	next                     http.RoundTripper
	failPart                 int // refuse to send this part number
	mu                       sync.Mutex
	parts, completes, plains int
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	if r.failPart > 0 && q.Get("partNumber") == strconv.Itoa(r.failPart) {
		return nil, errors.New("connection reset (injected)")
	}
	r.mu.Lock()
	switch {
	case req.Method == http.MethodPut && q.Has("partNumber"):
		r.parts++
	case req.Method == http.MethodPost && q.Has("uploadId"):
		r.completes++
	case req.Method == http.MethodPut:
		r.plains++
	}
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

func (r *recorder) count() (int, int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.parts, r.completes, r.plains
}

// sealFiles makes a sealed image of files and returns its directory.
func sealFiles(t testing.TB, files map[string][]byte) string {
	t.Helper()
	root := t.TempDir()
	tmp := filepath.Join(root, "tmp")
	for name, data := range files {
		os.MkdirAll(filepath.Join(tmp, imagestore.FilesDir), 0o700)
		if err := os.WriteFile(filepath.Join(tmp, imagestore.FilesDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := imagestore.Seal(tmp, filepath.Join(root, "img"), imagestore.Manifest{Template: "base"}); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "img")
}

// bigImage holds a file of three parts and a small one.
func bigImage(t *testing.T) string {
	big := make([]byte, 2*partSize+1)
	rand.Read(big)
	return sealFiles(t, map[string][]byte{"pages": big, "small": []byte("s")})
}

func putSample(t *testing.T, s *s3.Store) string {
	t.Helper()
	id := pandastack.NewID("snap")
	if _, err := s.Put(t.Context(), id, sealFiles(t, map[string][]byte{"f": []byte("data")})); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestParseURL(t *testing.T) {
	for raw, want := range map[string][2]string{
		"s3://b":              {"b", ""},
		"s3://b/":             {"b", ""},
		"s3://b/pre/fix/":     {"b", "pre/fix"},
		"s3://my-bucket/snap": {"my-bucket", "snap"},
	} {
		b, p, err := s3.ParseURL(raw)
		if err != nil || b != want[0] || p != want[1] {
			t.Errorf("ParseURL(%q) = %q, %q, %v; want %q, %q", raw, b, p, err, want[0], want[1])
		}
	}
	for _, bad := range []string{"", "s3://", "http://b/p", "s3://u:p@b/p", "s3://b/p?x=1", "b/p"} {
		if _, _, err := s3.ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
}
