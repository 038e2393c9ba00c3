package auth

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fanin-ml/fanin/internal/natsreq"
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
//	stream   fanin.v1.<job>.resend.*                                 direct-gradient jobs: a new owner's "send again from step s"
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
		str(wire.ResendWildcard(job)),
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
		{wire.ResendWildcard(job), jwt.Stream},
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
// ($SYS.REQ.ACCOUNT.<key>.CLAIMS.UPDATE) and returns once every server of the cluster has stored
// it. The servers' account resolver must take new accounts (nats-server's "full" resolver;
// ConfigureServer and ServerConfig set one up). Stored by one server is not enough: a client that
// connects to another one before the update reached it makes that server look the account up
// from its peers while its handshake waits.
//
// The servers are the one that answers first and those it has routes to. One that does not answer
// within accountPatience of the first (partitioned, or dying) is not waited for: it learns the
// account from its peers when a client connects to it.
func PushAccountJWT(ctx context.Context, sys *nats.Conn, accountJWT string) error {
	ac, err := jwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return fmt.Errorf("push account: %w", err)
	}
	if _, err := askServers(ctx, sys, "$SYS.REQ.ACCOUNT."+ac.Subject+".CLAIMS.UPDATE", []byte(accountJWT)); err != nil {
		return fmt.Errorf("push account %s (%s): %w", ac.Name, ac.Subject, err)
	}
	return nil
}

// LoadAccount makes every server of the cluster load a pushed account now (by asking each for the
// account's connections, $SYS.REQ.ACCOUNT.<key>.CONNZ), once, before any client holds its
// credentials. A server loads an account when a client first connects to it, and several clients
// connecting at once each load it, the later ones dropping and re-adding its imports under the
// first: clients that do not retry (one written from docs/PROTOCOL.md, say) met "no responders".
// Servers as for PushAccountJWT.
func LoadAccount(ctx context.Context, sys *nats.Conn, key string) error {
	if _, err := askServers(ctx, sys, "$SYS.REQ.ACCOUNT."+key+".CONNZ", nil); err != nil {
		return fmt.Errorf("load account %s on the servers: %w", key, err)
	}
	return nil
}

// accountPatience is how long askServers waits for the other servers once one has answered.
const accountPatience = 3 * time.Second

// askServers sends a request that every server answers (a system account request) and gathers
// the answers, by server id, from the first server to answer and every server it has a route to,
// or as many of them as answer within accountPatience of the first. A request nobody answers
// within an attempt (natsreq.Attempt) is sent again while ctx lives, and the same answers count;
// a server that answers with an error makes it fail.
func askServers(ctx context.Context, sys *nats.Conn, subject string, body []byte) (map[string]bool, error) {
	var expect map[string]bool // set by the first answer
	inbox := sys.NewInbox()
	sub, err := sys.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	answered := map[string]bool{}
	var patience time.Time // set by the first answer
	for {
		if err := sys.PublishRequest(subject, inbox, body); err != nil {
			return nil, err
		}
		attempt := time.Now().Add(natsreq.Attempt)
		for {
			end := attempt
			if !patience.IsZero() {
				end = patience
			}
			actx, cancel := context.WithDeadline(ctx, end)
			m, err := sub.NextMsgWithContext(actx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("%d of %d servers answered: %w", len(answered), max(len(expect), 1), ctx.Err())
				}
				if !patience.IsZero() { // the missing servers are not waited for
					return answered, nil
				}
				break // nobody answered: ask again
			}
			var resp struct {
				Server struct {
					ID string `json:"id"`
				} `json:"server"`
				Error *struct {
					Code        int    `json:"code"`
					Description string `json:"description"`
				} `json:"error"`
			}
			if err := json.Unmarshal(m.Data, &resp); err != nil {
				return nil, fmt.Errorf("an answer that is no server's: %w", err)
			}
			if resp.Error != nil {
				return nil, fmt.Errorf("server %s: %s (%d)", resp.Server.ID, resp.Error.Description, resp.Error.Code)
			}
			if expect == nil {
				if expect, err = clusterOf(ctx, sys, resp.Server.ID); err != nil {
					return nil, err
				}
			}
			answered[resp.Server.ID] = true
			if patience.IsZero() {
				patience = time.Now().Add(accountPatience)
			}
			if all(answered, expect) {
				return answered, nil
			}
		}
	}
}

func all(answered, expect map[string]bool) bool {
	for id := range expect {
		if !answered[id] {
			return false
		}
	}
	return true
}

// clusterOf is the id of server id and of every server it has a route to.
func clusterOf(ctx context.Context, sys *nats.Conn, id string) (map[string]bool, error) {
	m, err := natsreq.Request(ctx, sys, "$SYS.REQ.SERVER."+id+".ROUTEZ", nil)
	if err != nil {
		return nil, fmt.Errorf("routes of server %s: %w", id, err)
	}
	var resp struct {
		Data struct {
			Routes []struct {
				RemoteID string `json:"remote_id"`
			} `json:"routes"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("routes of server %s: %w", id, err)
	}
	out := map[string]bool{id: true}
	for _, r := range resp.Data.Routes {
		if r.RemoteID != "" {
			out[r.RemoteID] = true
		}
	}
	return out, nil
}
