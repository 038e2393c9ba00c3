package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fanin-ml/fanin/wire"
)

// Tenant isolation is an account boundary (docs/SECURITY.md). fanin's state (every stream and
// bucket, and so the JetStream API) lives in the fanin account, whose only users are fanin's own
// components. Each job has an account of its own; its workers are users of that account, which
// has no JetStream of its own and reaches into the fanin account only through what the fanin
// account exports and the job account imports:
//
//	service  fanin.v1.<job>.grad.*                                   publish gradients, answered by JetStream
//	service  fanin.v1.<job>.init.*                                   init "upload" jobs only: the step-0 upload
//	service  $JS.API.DIRECT.GET.FANIN_PARAMS_<job>.fanin.v1.<job>.params.*   the latest parameters of a shard
//	service  $JS.API.DIRECT.GET.FANIN_PARAMS_<job>                   direct gets with a request body, same stream
//	service  $JS.API.DIRECT.GET.KV_fanin-jobs.$KV.fanin-jobs.<job>   the job's record
//	service  $JS.API.DIRECT.GET.KV_fanin-assign.$KV.fanin-assign.<job>   the elastic workers' assignment
//	service  fanin.v1.<job>.workers                                  elastic workers' beats, to the autoscaler (not while throttled)
//	stream   fanin.v1.<job>.params.*                                 parameters, pushed after every step
//	stream   fanin.v1.<job>.rejects                                  the job's rejections
//	stream   fanin.v1.<job>.inbox.>                                  rejections sent to a Fanin-Reply-To
//
// The fanin account exports each of these for every job (a wildcard in the job's place), but
// only to an account that holds an activation token for it: the token names the importing
// account and narrows the subject to that one job, and only the authority can sign it. A
// request that crosses a service import has its reply subject replaced by the server (a
// _R_ subject of the exporting account that routes back to the importer), so the answers of
// JetStream land in the job's account, wherever the client asked them to go: no reply subject a
// client chooses can name a subject of the fanin account.
//
// A job account's key is derived from the authority's secret, the job's id and its creation
// time (JobAccountKey), so every gateway replica computes the same key without storing it, and a
// job re-created under the same id gets a new account: the old one's credentials reach nothing.

// exportsOfFanin are the fanin account's exports: each needs an activation token.
func exportsOfFanin() jwt.Exports {
	job := "*" // the job's token in each subject
	svc := func(subject string) *jwt.Export {
		return &jwt.Export{Name: subject, Subject: jwt.Subject(subject), Type: jwt.Service, TokenReq: true}
	}
	str := func(subject string) *jwt.Export {
		return &jwt.Export{Name: subject, Subject: jwt.Subject(subject), Type: jwt.Stream, TokenReq: true}
	}
	return jwt.Exports{
		svc(wire.GradWildcard(job)),
		svc(wire.InitWildcard(job)),
		svc(wire.WorkersSubject(job)),
		svc("$JS.API.DIRECT.GET.*"),
		svc("$JS.API.DIRECT.GET.*.>"),
		str(wire.ParamsWildcard(job)),
		str(wire.RejectsSubject(job)),
		str(wire.InboxWildcard(job)),
	}
}

// jobImport is one subject a job account imports from the fanin account.
type jobImport struct {
	subject string
	typ     jwt.ExportType
}

// jobImports lists what a job's account imports (see the package comment above).
func jobImports(j JobAccount) []jobImport {
	job, params := j.Job, wire.ParamsStream(j.Job)
	var im []jobImport
	if !j.NoIngest {
		im = append(im, jobImport{wire.GradWildcard(job), jwt.Service})
		if j.Upload {
			im = append(im, jobImport{wire.InitWildcard(job), jwt.Service})
		}
		im = append(im, jobImport{wire.WorkersSubject(job), jwt.Service})
	}
	return append(im, []jobImport{
		{wire.DirectGetLast(params, wire.ParamsWildcard(job)), jwt.Service},
		{wire.DirectGet(params), jwt.Service},
		{wire.JobRecordGet(job), jwt.Service},
		{wire.AssignmentGet(job), jwt.Service},
		{wire.ParamsWildcard(job), jwt.Stream},
		{wire.RejectsSubject(job), jwt.Stream},
		{wire.InboxWildcard(job), jwt.Stream},
	}...)
}

// JobAccount identifies the NATS account of one incarnation of a job.
type JobAccount struct {
	Job     string
	Created time.Time // the job record's creation time
	Upload  bool      // init "upload": the account may publish the step-0 parameters
	Ranks   int       // bounds the connections the account may hold
	// NoIngest: the account imports no gradient, upload or beat subjects, so the servers refuse
	// the job's publishes (no responders) and drop its elastic workers' beats. The gateway sets it
	// while the job is throttled for its bytes/s quota.
	NoIngest bool
}

// jobAccountKey derives the account key of a job incarnation from the authority's secret.
func (a *Authority) jobAccountKey(j JobAccount) (nkeys.KeyPair, error) {
	secret, err := a.account.Seed()
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, secret)
	fmt.Fprintf(mac, "fanin job account\x00%s\x00%d", j.Job, j.Created.UnixNano())
	return nkeys.FromRawSeed(nkeys.PrefixByteAccount, mac.Sum(nil))
}

// JobAccountKey is the public key of a job incarnation's account.
func (a *Authority) JobAccountKey(j JobAccount) (string, error) {
	kp, err := a.jobAccountKey(j)
	if err != nil {
		return "", err
	}
	return pub(kp), nil
}

// MaxJobConnections bounds the connections one job's account may hold: a few per rank.
func MaxJobConnections(ranks int) int64 { return int64(max(16, 4*ranks)) }

// maxSubsPerConnection bounds the subscriptions of a job's account, per connection it may hold.
const maxSubsPerConnection = 64

// JobAccountJWT is the JWT of a job's account: its imports, each with its activation token, no
// JetStream, bounded connections and subscriptions. It must reach the servers (PushAccountJWT)
// before the job's workers connect.
func (a *Authority) JobAccountJWT(j JobAccount) (string, error) {
	kp, err := a.jobAccountKey(j)
	if err != nil {
		return "", err
	}
	ac := jwt.NewAccountClaims(pub(kp))
	ac.Name = "fanin-job-" + j.Job
	ac.Tags.Add(JobTag(j.Job))
	ac.Limits.Conn = MaxJobConnections(j.Ranks)
	ac.Limits.Subs = ac.Limits.Conn * maxSubsPerConnection
	ac.Limits.LeafNodeConn = 0
	for _, im := range jobImports(j) {
		act := jwt.NewActivationClaims(pub(kp))
		act.Name = im.subject
		act.ImportSubject = jwt.Subject(im.subject)
		act.ImportType = im.typ
		tok, err := act.Encode(a.account)
		if err != nil {
			return "", fmt.Errorf("activation of %s for job %s: %w", im.subject, j.Job, err)
		}
		ac.Imports.Add(&jwt.Import{
			Name: im.subject, Subject: jwt.Subject(im.subject), Account: pub(a.account),
			Token: tok, Type: im.typ,
		})
	}
	return ac.Encode(a.operator)
}

// ClosedJobAccountJWT is the JWT of a deleted job's account: no imports, no connections, and every
// user issued until now revoked. Pushed when the job is deleted, it disconnects the job's workers.
func (a *Authority) ClosedJobAccountJWT(j JobAccount, at time.Time) (string, error) {
	kp, err := a.jobAccountKey(j)
	if err != nil {
		return "", err
	}
	ac := jwt.NewAccountClaims(pub(kp))
	ac.Name = "fanin-job-" + j.Job + " (deleted)"
	ac.Tags.Add(JobTag(j.Job))
	ac.Limits.Conn = 0
	ac.Limits.LeafNodeConn = 0
	ac.RevokeAt(jwt.All, at.Add(time.Second)) // IssuedAt has second precision: cover this second too
	return ac.Encode(a.operator)
}

// JobCredentials mints credentials for the workers of a job: a user of the job's account, with
// JobPermissions inside it. ttl 0 means they do not expire; deleting the job revokes them.
func (a *Authority) JobCredentials(j JobAccount, ttl time.Duration) (Credentials, error) {
	kp, err := a.jobAccountKey(j)
	if err != nil {
		return Credentials{}, err
	}
	perms := JobPermissions(j.Job, j.Upload)
	return mintUser(kp, "", "fanin-job-"+j.Job, &perms, wire.InboxPrefix(j.Job), ttl, JobTag(j.Job))
}

// PushAccountJWT sends an account JWT to the servers over a system account connection
// ($SYS.REQ.ACCOUNT.<key>.CLAIMS.UPDATE) and waits for a server to confirm. The servers' account
// resolver must take new accounts (nats-server's "full" resolver; ConfigureServer and
// ServerConfig set one up).
func PushAccountJWT(ctx context.Context, sys *nats.Conn, accountJWT string) error {
	ac, err := jwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return fmt.Errorf("push account: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := sys.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+ac.Subject+".CLAIMS.UPDATE", []byte(accountJWT))
	if err != nil {
		return fmt.Errorf("push account %s (%s): %w", ac.Name, ac.Subject, err)
	}
	if strings.Contains(string(m.Data), `"error"`) {
		return fmt.Errorf("push account %s (%s): %s", ac.Name, ac.Subject, m.Data)
	}
	return nil
}
