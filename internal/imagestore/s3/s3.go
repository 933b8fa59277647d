// Package s3 keeps snapshot images in S3-compatible object storage, so
// every server sharing the bucket (and the database) can restore any
// snapshot. Objects are <prefix>/<id>/image/<file> and, written last as the
// image's commit mark, <prefix>/<id>/manifest.json. Restores run from a
// local cache (imagestore.Cache): a remote image is downloaded once,
// checked file by file against its manifest while it streams, and checked
// again before every restore. Path-style addressing, so any endpoint works
// without wildcard DNS. Only cmd/ imports it.
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// Config says where the images go.
type Config struct {
	Endpoint  string // http(s)://host[:port] of the S3 API
	Bucket    string // must exist
	Prefix    string // key prefix inside the bucket ("" for none)
	Region    string // signing region; "" means us-east-1
	AccessKey string
	SecretKey string

	CacheDir      string // local copies of images (required)
	CacheMaxBytes int64  // evict least recently used images past this; 0: no limit
	PartSize      int64  // files larger than this upload in parts of this size; 0: 64 MiB
	Parallel      int    // objects or parts in flight at once; 0: 4

	HTTPClient *http.Client // nil: a client of its own
	// StallTimeout gives up a request that moves no byte for this long
	// (sandbox_unavailable); 0: DefaultStallTimeout.
	StallTimeout time.Duration
}

// DefaultPartSize is the multipart threshold and part size.
const DefaultPartSize = 64 << 20

// ParseURL splits s3://bucket/prefix.
func ParseURL(raw string) (bucket, prefix string, err error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "s3" || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return "", "", fmt.Errorf("snapshot store %q: want s3://bucket or s3://bucket/prefix", raw)
	}
	return u.Host, strings.Trim(u.Path, "/"), nil
}

// Store is an ImageStore on an S3 bucket.
type Store struct {
	cfg    Config
	client *awss3.Client
	cache  *imagestore.Cache
}

var _ pandastack.ImageStore = (*Store)(nil)

// New returns the store and checks that the bucket answers.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" || cfg.CacheDir == "" {
		return nil, errors.New("s3 image store: endpoint, bucket and cache dir are required")
	}
	if u, err := url.Parse(cfg.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("s3 image store: endpoint %q is not an http(s) URL", cfg.Endpoint)
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("s3 image store: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set")
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if cfg.PartSize <= 0 {
		cfg.PartSize = DefaultPartSize
	}
	if cfg.PartSize < 5<<20 {
		return nil, fmt.Errorf("s3 image store: part size %d is under S3's minimum of 5 MiB", cfg.PartSize)
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	cfg.Prefix = strings.Trim(cfg.Prefix, "/")
	cache, err := imagestore.NewCache(cfg.CacheDir, cfg.CacheMaxBytes)
	if err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	next := cfg.HTTPClient.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	guarded := *cfg.HTTPClient // the caller's client stays as it was
	guarded.Transport = &stallGuard{next: next, after: cfg.StallTimeout}
	cfg.HTTPClient = &guarded
	client := awss3.New(awss3.Options{
		Region:       cfg.Region,
		BaseEndpoint: aws.String(cfg.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, ""),
		HTTPClient:   cfg.HTTPClient,
		// Our own CRC-32C per file guards the bytes end to end; the SDK's
		// optional checksums are not needed and not every server has them.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
	s := &Store{cfg: cfg, client: client, cache: cache}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := client.HeadBucket(hctx, &awss3.HeadBucketInput{Bucket: aws.String(cfg.Bucket)}); err != nil {
		// A HEAD's answer has no body to say why: name what a 403 and a
		// 404 can mean (some servers answer an unknown key with 404).
		hint := ""
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &status) {
			switch status.HTTPStatusCode() {
			case http.StatusForbidden:
				hint = ": the store refused the credentials; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the key's rights on the bucket"
			case http.StatusNotFound:
				hint = ": no such bucket, or an access key the store does not know; check the bucket's name and AWS_ACCESS_KEY_ID"
			case http.StatusBadRequest:
				hint = ": check the region (AWS_REGION) and the endpoint"
			}
		}
		return nil, fmt.Errorf("s3 image store: bucket %s at %s%s (%w)", cfg.Bucket, cfg.Endpoint, hint, err)
	}
	return s, nil
}

// String names the store for logs (no credentials).
func (s *Store) String() string {
	return "s3://" + path.Join(s.cfg.Bucket, s.cfg.Prefix) + " at " + s.cfg.Endpoint
}

// CacheRoot is the local cache's directory; staging an image beside it
// makes Put's move into the cache a rename.
func (s *Store) CacheRoot() string { return s.cache.Root() }

func (s *Store) key(id string, parts ...string) string {
	return path.Join(append([]string{s.cfg.Prefix, id}, parts...)...)
}

func (s *Store) Put(ctx context.Context, id, dir string) (int64, error) {
	if err := imagestore.ValidID(id); err != nil {
		os.RemoveAll(dir)
		return 0, err
	}
	man, err := imagestore.Verify(dir, "image "+id)
	if err != nil {
		os.RemoveAll(dir)
		return 0, err
	}
	if _, err := s.head(ctx, s.key(id, imagestore.ManifestName)); err == nil {
		os.RemoveAll(dir)
		return 0, pandastack.Errorf(pandastack.EConflict, "image %s already exists", id)
	} else if !pandastack.IsCode(err, pandastack.ENotFound) {
		os.RemoveAll(dir)
		return 0, unreachable(err)
	}
	if err := s.upload(ctx, id, dir, man); err != nil {
		os.RemoveAll(dir)
		// Nothing half-uploaded stays behind, whatever ctx says.
		s.deleteObjects(context.WithoutCancel(ctx), id, man)
		return 0, unreachable(fmt.Errorf("upload image %s to %s: %w", id, s, err))
	}
	// The local copy becomes the cache's: a restore on this server needs
	// no download.
	if img, err := s.cache.Admit(id, dir); err == nil {
		img.Close()
	}
	return man.Size(), nil
}

// upload sends every file, then the manifest (the commit mark).
func (s *Store) upload(ctx context.Context, id, dir string, man imagestore.Manifest) error {
	names := sortedNames(man)
	err := s.parallel(ctx, len(names), func(ctx context.Context, i int) error {
		return s.putFile(ctx, s.key(id, imagestore.FilesDir, names[i]), filepath.Join(dir, imagestore.FilesDir, filepath.FromSlash(names[i])), man.Files[names[i]].Size)
	})
	if err != nil {
		return err
	}
	return s.putFile(ctx, s.key(id, imagestore.ManifestName), filepath.Join(dir, imagestore.ManifestName), -1)
}

// putFile uploads one file: in one request up to the part size, else in
// parts, several at once.
func (s *Store) putFile(ctx context.Context, key, file string, size int64) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if size < 0 {
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		size = fi.Size()
	}
	if size <= s.cfg.PartSize {
		_, err := s.client.PutObject(ctx, &awss3.PutObjectInput{
			Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key),
			Body: io.NewSectionReader(f, 0, size), ContentLength: aws.Int64(size),
		}, unsignedPayload)
		return err
	}
	up, err := s.client.CreateMultipartUpload(ctx, &awss3.CreateMultipartUploadInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		return err
	}
	n := int((size + s.cfg.PartSize - 1) / s.cfg.PartSize)
	parts := make([]types.CompletedPart, n)
	err = s.parallel(ctx, n, func(ctx context.Context, i int) error {
		off := int64(i) * s.cfg.PartSize
		length := min(s.cfg.PartSize, size-off)
		out, err := s.client.UploadPart(ctx, &awss3.UploadPartInput{
			Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key), UploadId: up.UploadId,
			PartNumber: aws.Int32(int32(i + 1)), Body: io.NewSectionReader(f, off, length), ContentLength: aws.Int64(length),
		}, unsignedPayload)
		if err != nil {
			return fmt.Errorf("part %d of %s: %w", i+1, key, err)
		}
		parts[i] = types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(int32(i + 1))}
		return nil
	})
	if err == nil {
		_, err = s.client.CompleteMultipartUpload(ctx, &awss3.CompleteMultipartUploadInput{
			Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key), UploadId: up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		})
	}
	if err != nil {
		s.client.AbortMultipartUpload(context.WithoutCancel(ctx), &awss3.AbortMultipartUploadInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key), UploadId: up.UploadId})
	}
	return err
}

// unsignedPayload signs an upload's headers but not its body: the body's
// SHA-256 would be one more pass over every byte, and each file's CRC-32C
// in the manifest already guards it end to end (checked on download).
var unsignedPayload = awss3.WithAPIOptions(v4.SwapComputePayloadSHA256ForUnsignedPayloadMiddleware)

func (s *Store) Open(ctx context.Context, id string) (pandastack.OpenImage, error) {
	if imagestore.ValidID(id) != nil {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no image %q", id)
	}
	what := "snapshot " + id
	if img, ok, err := s.cache.Open(id, what); ok || err != nil {
		return img, err
	}
	done, err := s.cache.Fill(ctx, id)
	if err != nil {
		return nil, err
	}
	defer done()
	if img, ok, err := s.cache.Open(id, what); ok || err != nil { // another request fetched it meanwhile
		return img, err
	}
	tmp, err := s.cache.TempDir(id)
	if err != nil {
		return nil, err
	}
	if err := s.download(ctx, id, tmp, what); err != nil {
		os.RemoveAll(tmp)
		return nil, unreachable(imagestore.StorageError(err))
	}
	return s.cache.Admit(id, tmp)
}

// download fetches the manifest, then every file, each checked against
// the manifest as it streams in; then it syncs the copy.
func (s *Store) download(ctx context.Context, id, tmp, what string) error {
	mkey := s.key(id, imagestore.ManifestName)
	body, err := s.get(ctx, mkey)
	if err != nil {
		if pandastack.IsCode(err, pandastack.ENotFound) {
			return pandastack.Errorf(pandastack.ENotFound, "no image %s in the bucket (deleted, or never uploaded)", id)
		}
		return fmt.Errorf("download %s from %s: %w", what, s, err)
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	body.Close()
	if err != nil {
		return fmt.Errorf("download %s from %s: %w", what, s, err)
	}
	man, err := imagestore.ParseManifest(b, what)
	if err != nil {
		return err
	}
	names := sortedNames(man)
	err = s.parallel(ctx, len(names), func(ctx context.Context, i int) error {
		name := names[i]
		return s.getFile(ctx, s.key(id, imagestore.FilesDir, name), filepath.Join(tmp, imagestore.FilesDir, filepath.FromSlash(name)), what, name, man.Files[name])
	})
	if err != nil {
		return err
	}
	if !man.CreatedAt.IsZero() {
		// The files keep the time the image was made, as the node's that
		// took it do (the runtime dates an image of an older build by it,
		// to restore it with the agent of its time).
		for _, name := range names {
			os.Chtimes(filepath.Join(tmp, imagestore.FilesDir, filepath.FromSlash(name)), man.CreatedAt, man.CreatedAt)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, imagestore.ManifestName), b, 0o600); err != nil {
		return err
	}
	return imagestore.SyncTree(tmp)
}

// getFile streams one object into file, checking size and checksum.
func (s *Store) getFile(ctx context.Context, key, file, what, name string, want imagestore.FileSum) error {
	body, err := s.get(ctx, key)
	if err != nil {
		if pandastack.IsCode(err, pandastack.ENotFound) {
			return imagestore.CheckFile(what, name, imagestore.FileSum{}, want, false)
		}
		return fmt.Errorf("download %s of %s: %w", name, what, err)
	}
	defer body.Close()
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	h := imagestore.NewCRC()
	// One byte past the expected size tells a longer object from an exact one.
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(body, want.Size+1))
	if err != nil {
		return fmt.Errorf("download %s of %s: %w", name, what, err)
	}
	if err := imagestore.CheckFile(what, name, imagestore.FileSum{Size: n, CRC32C: h.Sum32()}, want, true); err != nil {
		return err
	}
	return f.Close()
}

func (s *Store) Delete(ctx context.Context, id string) error {
	if imagestore.ValidID(id) != nil {
		return nil
	}
	s.cache.Remove(id)
	return unreachable(s.deleteObjects(ctx, id, imagestore.Manifest{}))
}

// SweepCache removes the cached copies of images that keep says are gone
// (deleted through another server), unused for olderThan, and returns
// their ids.
func (s *Store) SweepCache(keep func(id string) bool, olderThan time.Duration) []string {
	return s.cache.Sweep(keep, olderThan)
}

// unreachable marks err EUnavailable when the bucket did not answer (a
// connection that failed, timed out or was cut in the middle of a body,
// or a 5xx other than 501 after the SDK's retries), which a client may
// retry; err stays in the chain for the
// log. A certificate the server's TLS does not pass, say, stays internal:
// retrying does not help.
func unreachable(err error) error {
	var op *net.OpError
	var ne net.Error
	var status interface{ HTTPStatusCode() int }
	if err == nil || pandastack.ErrorCode(err) != pandastack.EInternal {
		return err
	}
	if errors.As(err, &op) || (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, io.ErrUnexpectedEOF) ||
		(errors.As(err, &status) && status.HTTPStatusCode() >= 500 && status.HTTPStatusCode() != http.StatusNotImplemented) {
		return fmt.Errorf("%w (%w)", pandastack.Errorf(pandastack.EUnavailable, "the snapshot store does not answer; retry"), err)
	}
	return err
}

// deleteObjects removes the manifest first (the image stops being
// whole), then every object under the image's prefix; man's files are
// deleted too in case listing lags behind a failed upload.
func (s *Store) deleteObjects(ctx context.Context, id string, man imagestore.Manifest) error {
	keys := map[string]bool{}
	for name := range man.Files {
		keys[s.key(id, imagestore.FilesDir, name)] = true
	}
	if err := s.del(ctx, s.key(id, imagestore.ManifestName)); err != nil {
		return fmt.Errorf("delete image %s from %s: %w", id, s, err)
	}
	p := awss3.NewListObjectsV2Paginator(s.client, &awss3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(s.key(id) + "/")})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return fmt.Errorf("delete image %s from %s: %w", id, s, err)
		}
		for _, o := range page.Contents {
			keys[aws.ToString(o.Key)] = true
		}
	}
	list := make([]string, 0, len(keys))
	for k := range keys {
		list = append(list, k)
	}
	if err := s.parallel(ctx, len(list), func(ctx context.Context, i int) error { return s.del(ctx, list[i]) }); err != nil {
		return err
	}
	s.abortUploads(ctx, id)
	return nil
}

// abortUploads aborts the multipart uploads under image id: parts of an
// upload cut short by a crash are kept (and billed) until aborted, and
// list only as uploads. Best effort: a key without the right to list
// uploads (s3:ListBucketMultipartUploads) or a server without the call
// still deletes the image; a bucket lifecycle rule that aborts
// incomplete uploads then does this.
func (s *Store) abortUploads(ctx context.Context, id string) {
	ups := awss3.NewListMultipartUploadsPaginator(s.client, &awss3.ListMultipartUploadsInput{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(s.key(id) + "/")})
	for ups.HasMorePages() {
		page, err := ups.NextPage(ctx)
		if err != nil {
			return
		}
		for _, u := range page.Uploads {
			s.client.AbortMultipartUpload(ctx, &awss3.AbortMultipartUploadInput{Bucket: aws.String(s.cfg.Bucket), Key: u.Key, UploadId: u.UploadId})
		}
	}
}

func (s *Store) del(ctx context.Context, key string) error {
	_, err := s.client.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
	if err != nil && notFound(err) {
		return nil
	}
	return err
}

func (s *Store) head(ctx context.Context, key string) (*awss3.HeadObjectOutput, error) {
	out, err := s.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
	if err != nil && notFound(err) {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no object %s", key)
	}
	return out, err
}

func (s *Store) get(ctx context.Context, key string) (io.ReadCloser, error) {
	out, err := s.client.GetObject(ctx, &awss3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(key)})
	if err != nil {
		if notFound(err) {
			return nil, pandastack.Errorf(pandastack.ENotFound, "no object %s", key)
		}
		return nil, err
	}
	return out.Body, nil
}

// notFound reports a 404 (NoSuchKey on GET, a bare 404 on HEAD).
func notFound(err error) bool {
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var status interface{ HTTPStatusCode() int }
	return errors.As(err, &nsk) || errors.As(err, &nf) || (errors.As(err, &status) && status.HTTPStatusCode() == http.StatusNotFound)
}

// parallel runs fn(0..n-1) with at most cfg.Parallel at once and returns
// the first error; after one, the others are cancelled.
func (s *Store) parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, s.cfg.Parallel)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { first = err; cancel(err) })
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

func sortedNames(man imagestore.Manifest) []string {
	names := make([]string, 0, len(man.Files))
	for name := range man.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
