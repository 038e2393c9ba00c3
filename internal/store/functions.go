package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The user functions' state: a bucket of records, one per <owner>/<name>@<version>, and an object
// store of modules, one object per sha256 (content-addressed: two names may share a module).
const (
	FunctionsBucket = "fanin-functions" // key <owner>.<name>.<version>: a FunctionRecord, JSON
	ModulesBucket   = "fanin-modules"   // object <sha256 hex>: a WebAssembly module
)

// FunctionRecord is one uploaded function: a name and version owned by a team (or "admin"),
// bound for good to one module.
type FunctionRecord struct {
	Owner   string          `json:"owner"`
	Name    string          `json:"name"`
	Version int             `json:"version"`
	Digest  string          `json:"digest"` // sha256 of the module, hex
	Size    int             `json:"size"`   // bytes of the module
	Created time.Time       `json:"created"`
	Info    json.RawMessage `json:"info"` // what the module declares (wasmfn.Info)
}

// Ref is the record's name as a job spec gives it: owner/name@version.
func (r *FunctionRecord) Ref() string { return r.Owner + "/" + r.Name + "@" + strconv.Itoa(r.Version) }

func functionKey(owner, name string, version int) string {
	return owner + "." + name + "." + strconv.Itoa(version)
}

// ErrFunctionExists: the name and version are taken by another module (versions are immutable).
var ErrFunctionExists = errors.New("function version exists with other bytes")

// ErrFunctionNotFound: no such owner/name@version.
var ErrFunctionNotFound = errors.New("no such function")

// Functions is the user functions' store.
type Functions struct {
	kv  jetstream.KeyValue
	obj jetstream.ObjectStore
}

// OpenFunctions creates the bucket and the object store if they do not exist and opens them.
func OpenFunctions(ctx context.Context, js jetstream.JetStream) (*Functions, error) {
	r := StateReplicas(js.Conn())
	kv, err := EnsureKV(ctx, js, jetstream.KeyValueConfig{Bucket: FunctionsBucket, Description: "fanin user functions",
		History: 1, Storage: jetstream.FileStorage, Replicas: r})
	if err != nil {
		return nil, err
	}
	var obj jetstream.ObjectStore
	err = untilUp(ctx, "object store "+ModulesBucket, func() (err error) {
		obj, err = js.ObjectStore(ctx, ModulesBucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			obj, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: ModulesBucket,
				Description: "fanin user functions' WebAssembly modules", Storage: jetstream.FileStorage, Replicas: r})
			if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				obj, err = js.ObjectStore(ctx, ModulesBucket)
			}
		}
		if vanished(err) {
			return notYet{err}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open object store %s: %w", ModulesBucket, err)
	}
	return &Functions{kv: kv, obj: obj}, nil
}

// Put stores the module and binds rec's name and version to it. The same bytes under the same
// name and version again is no error (created false); other bytes are ErrFunctionExists.
func (f *Functions) Put(ctx context.Context, rec FunctionRecord, code []byte) (created bool, err error) {
	key := functionKey(rec.Owner, rec.Name, rec.Version)
	if old, err := f.Get(ctx, rec.Owner, rec.Name, rec.Version); err == nil {
		if old.Digest == rec.Digest {
			return false, nil
		}
		return false, fmt.Errorf("%w: %s is %s, not %s", ErrFunctionExists, rec.Ref(), old.Digest, rec.Digest)
	} else if !errors.Is(err, ErrFunctionNotFound) {
		return false, err
	}
	if _, err := f.obj.GetInfo(ctx, rec.Digest); errors.Is(err, jetstream.ErrObjectNotFound) {
		if _, err := f.obj.PutBytes(ctx, rec.Digest, code); err != nil {
			return false, fmt.Errorf("store module %s: %w", rec.Digest, err)
		}
	} else if err != nil {
		return false, fmt.Errorf("look up module %s: %w", rec.Digest, err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	if _, err := f.kv.Create(ctx, key, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) { // raced with another upload of the version
			return f.Put(ctx, rec, code)
		}
		return false, fmt.Errorf("store function %s: %w", rec.Ref(), err)
	}
	return true, nil
}

// Get returns the record of owner/name@version.
func (f *Functions) Get(ctx context.Context, owner, name string, version int) (*FunctionRecord, error) {
	e, err := f.kv.Get(ctx, functionKey(owner, name, version))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s/%s@%d", ErrFunctionNotFound, owner, name, version)
	}
	if err != nil {
		return nil, fmt.Errorf("read function %s/%s@%d: %w", owner, name, version, err)
	}
	var rec FunctionRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, fmt.Errorf("function %s/%s@%d: %w", owner, name, version, err)
	}
	return &rec, nil
}

// List returns the records of owner ("" for every owner), sorted by name and version.
func (f *Functions) List(ctx context.Context, owner string) ([]FunctionRecord, error) {
	filter := ">"
	if owner != "" {
		filter = owner + ".>"
	}
	lister, err := f.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list functions: %w", err)
	}
	out := []FunctionRecord{}
	for k := range lister.Keys() {
		parts := strings.Split(k, ".")
		if len(parts) != 3 {
			continue
		}
		v, _ := strconv.Atoi(parts[2])
		rec, err := f.Get(ctx, parts[0], parts[1], v)
		if errors.Is(err, ErrFunctionNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *rec)
	}
	slices.SortFunc(out, func(a, b FunctionRecord) int {
		if c := strings.Compare(a.Owner+"/"+a.Name, b.Owner+"/"+b.Name); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return out, nil
}

// Delete removes owner/name@version, and its module unless another record still names it. The
// caller checks first that no job uses it.
func (f *Functions) Delete(ctx context.Context, owner, name string, version int) error {
	rec, err := f.Get(ctx, owner, name, version)
	if err != nil {
		return err
	}
	if err := f.kv.Delete(ctx, functionKey(owner, name, version)); err != nil {
		return fmt.Errorf("delete function %s: %w", rec.Ref(), err)
	}
	all, err := f.List(ctx, "")
	if err != nil {
		return err
	}
	if slices.ContainsFunc(all, func(r FunctionRecord) bool { return r.Digest == rec.Digest }) {
		return nil
	}
	if err := f.obj.Delete(ctx, rec.Digest); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("delete module %s: %w", rec.Digest, err)
	}
	return nil
}

// Module returns the bytes of the module with the given sha256.
func (f *Functions) Module(ctx context.Context, digest string) ([]byte, error) {
	b, err := f.obj.GetBytes(ctx, digest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: no module %s", ErrFunctionNotFound, digest)
	}
	if err != nil {
		return nil, fmt.Errorf("read module %s: %w", digest, err)
	}
	return b, nil
}
