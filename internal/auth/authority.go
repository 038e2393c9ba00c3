package auth

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// AccountName is the name of the NATS account that holds all of fanin's subjects and streams.
const AccountName = "FANIN"

// Authority holds the keys of an operator-mode NATS deployment for fanin and mints credentials.
//
// Why operator mode rather than auth callout: the server verifies a user JWT offline against the
// account it trusts, so no fanin component sits on the connection path (workers connect while
// the gateway is down) and a job's credentials are minted by signing, without a round trip; the
// same keys work for the embedded server of `fanin dev` (memory resolver) and for a production
// cluster (resolver preload or the full resolver).
type Authority struct {
	operator nkeys.KeyPair // signs the account JWTs
	system   nkeys.KeyPair // the system account's identity
	account  nkeys.KeyPair // the fanin account's identity
	signer   nkeys.KeyPair // the fanin account's signing key: signs every user
	admin    string        // the API's admin token

	mu      sync.Mutex       // guards revoked
	revoked map[string]int64 // user public key -> revoked at (Unix seconds)
}

// Files of an authority directory. Seeds and the admin token are secrets (mode 0600).
const (
	operatorFile = "operator.nk"
	systemFile   = "system.nk"
	accountFile  = "account.nk"
	signerFile   = "signer.nk"
	adminFile    = "admin.token"
)

// New makes an authority with fresh keys and admin token, kept in memory only.
func New() (*Authority, error) {
	a := &Authority{revoked: map[string]int64{}}
	var err error
	for _, k := range []struct {
		kp  *nkeys.KeyPair
		mk  func() (nkeys.KeyPair, error)
		err string
	}{
		{&a.operator, nkeys.CreateOperator, "operator"},
		{&a.system, nkeys.CreateAccount, "system account"},
		{&a.account, nkeys.CreateAccount, "fanin account"},
		{&a.signer, nkeys.CreateAccount, "signing key"},
	} {
		if *k.kp, err = k.mk(); err != nil {
			return nil, fmt.Errorf("create %s key: %w", k.err, err)
		}
	}
	if a.admin, err = NewToken(KindAdmin); err != nil {
		return nil, err
	}
	return a, nil
}

// Load reads an authority from dir, creating it (keys and admin token) if dir holds none. The
// directory keeps the fanin account's identity across restarts: JetStream stores its data per
// account, and the credentials handed out stay valid.
func Load(dir string) (*Authority, error) {
	if _, err := os.Stat(filepath.Join(dir, accountFile)); errors.Is(err, os.ErrNotExist) {
		a, err := New()
		if err != nil {
			return nil, err
		}
		return a, a.Save(dir)
	}
	a := &Authority{revoked: map[string]int64{}}
	for _, k := range []struct {
		kp   *nkeys.KeyPair
		file string
	}{{&a.operator, operatorFile}, {&a.system, systemFile}, {&a.account, accountFile}, {&a.signer, signerFile}} {
		seed, err := os.ReadFile(filepath.Join(dir, k.file))
		if err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
		if *k.kp, err = nkeys.FromSeed([]byte(strings.TrimSpace(string(seed)))); err != nil {
			return nil, fmt.Errorf("auth: %s: not an nkey seed", k.file)
		}
	}
	tok, err := os.ReadFile(filepath.Join(dir, adminFile))
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	a.admin = strings.TrimSpace(string(tok))
	if a.admin == "" {
		return nil, fmt.Errorf("auth: %s is empty", filepath.Join(dir, adminFile))
	}
	return a, nil
}

// Save writes the keys and the admin token to dir (created 0700; files 0600).
func (a *Authority) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	for _, k := range []struct {
		kp   nkeys.KeyPair
		file string
	}{{a.operator, operatorFile}, {a.system, systemFile}, {a.account, accountFile}, {a.signer, signerFile}} {
		seed, err := k.kp.Seed()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, k.file), append(seed, '\n'), 0o600); err != nil {
			return fmt.Errorf("auth: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, adminFile), []byte(a.admin+"\n"), 0o600); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	return nil
}

// AdminTokenFile is where Save keeps the admin token in an authority directory.
func AdminTokenFile(dir string) string { return filepath.Join(dir, adminFile) }

// AdminToken is the API's admin token.
func (a *Authority) AdminToken() string { return a.admin }

// AccountKey is the fanin account's public key.
func (a *Authority) AccountKey() string { return pub(a.account) }

// SystemAccountKey is the system account's public key.
func (a *Authority) SystemAccountKey() string { return pub(a.system) }

func pub(kp nkeys.KeyPair) string {
	p, _ := kp.PublicKey() // a key pair made or read above always has one
	return p
}

// OperatorJWT is the self-signed operator JWT the server trusts.
func (a *Authority) OperatorJWT() (string, error) {
	oc := jwt.NewOperatorClaims(pub(a.operator))
	oc.Name = "fanin"
	oc.SystemAccount = pub(a.system)
	return oc.Encode(a.operator)
}

// SystemAccountJWT is the system account's JWT.
func (a *Authority) SystemAccountJWT() (string, error) {
	ac := jwt.NewAccountClaims(pub(a.system))
	ac.Name = "SYS"
	return ac.Encode(a.operator)
}

// AccountJWT is the fanin account's JWT: JetStream enabled without limits (fanin's quotas are its
// own), the signing key that signs its users, the exports that job accounts import (accounts.go),
// and the revocations so far.
func (a *Authority) AccountJWT() (string, error) {
	ac := jwt.NewAccountClaims(pub(a.account))
	ac.Name = AccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	ac.SigningKeys.Add(pub(a.signer))
	ac.Exports = exportsOfFanin()
	a.mu.Lock()
	for user, at := range a.revoked {
		ac.RevokeAt(user, time.Unix(at, 0))
	}
	a.mu.Unlock()
	return ac.Encode(a.operator)
}

// ResolverDir is where an embedded server configured by ConfigureServer keeps the account JWTs
// pushed to it (job accounts), below its JetStream store directory.
const ResolverDir = "accounts"

// HandshakeTimeout is how long a NATS server configured by ConfigureServer or ServerConfig waits
// for a client to authenticate (nats-server's auth timeout, 2 s by default). A client proves its
// identity by signing the server's nonce with its nkey; one in a language whose signing is slow
// until its runtime has warmed up (Node.js's nats client signs in JavaScript) took more than 2 s
// under CPU load, above all several connections at once, and was cut off in the handshake: its
// first connections to a new job failed, and a retry always got through.
const HandshakeTimeout = 10 * time.Second

// ConfigureServer puts a NATS server in operator mode trusting this authority, with nats-server's
// "full" account resolver (account JWTs kept in files, new accounts pushed at run time), preloaded
// with the system and fanin accounts, and an auth timeout of HandshakeTimeout unless o sets one.
// The server's StoreDir must be set.
func (a *Authority) ConfigureServer(o *server.Options) error {
	opJWT, err := a.OperatorJWT()
	if err != nil {
		return err
	}
	oc, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return err
	}
	if o.StoreDir == "" {
		return errors.New("operator mode needs the server's store directory for its account resolver")
	}
	res, err := server.NewDirAccResolver(filepath.Join(o.StoreDir, ResolverDir), 0, time.Minute, server.RenameDeleted)
	if err != nil {
		return fmt.Errorf("account resolver: %w", err)
	}
	sysJWT, err := a.SystemAccountJWT()
	if err != nil {
		return err
	}
	accJWT, err := a.AccountJWT()
	if err != nil {
		return err
	}
	for key, j := range map[string]string{pub(a.system): sysJWT, pub(a.account): accJWT} {
		if err := res.Store(key, j); err != nil {
			return fmt.Errorf("account resolver: store %s: %w", key, err)
		}
	}
	o.TrustedOperators = []*jwt.OperatorClaims{oc}
	o.AccountResolver = res
	o.SystemAccount = pub(a.system)
	if o.AuthTimeout == 0 {
		o.AuthTimeout = HandshakeTimeout.Seconds()
	}
	return nil
}

// ServerConfig is a nats-server configuration fragment for an external server (or each server of a
// cluster) trusting this authority: the "full" account resolver, which keeps the job accounts the
// gateway pushes in resolverDir (relative paths are the server's working directory) and, in a
// cluster, shares them between servers; the system and fanin accounts are preloaded; clients
// have HandshakeTimeout to authenticate.
func (a *Authority) ServerConfig(resolverDir string) (string, error) {
	opJWT, err := a.OperatorJWT()
	if err != nil {
		return "", err
	}
	sysJWT, err := a.SystemAccountJWT()
	if err != nil {
		return "", err
	}
	accJWT, err := a.AccountJWT()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`# fanin: operator mode (generated by 'fanin auth init')
operator: %s
system_account: %s
resolver: {
  type: full
  dir: %q
  allow_delete: false
  interval: "2m"
}
resolver_preload: {
  %s: %s
  %s: %s
}
authorization: {
  timeout: %d
}
max_payload: 32MB
`, opJWT, pub(a.system), resolverDir, pub(a.system), sysJWT, pub(a.account), accJWT, int(HandshakeTimeout.Seconds())), nil
}

// Credentials are a NATS user: its public key, JWT and seed. Seed is a secret.
type Credentials struct {
	User        string
	JWT         string
	Seed        string
	InboxPrefix string // the prefix the user's connection must use for its inboxes, "" for any
	Expires     time.Time
}

// File is the credentials in the .creds file format (nats.UserCredentials, `nats --creds`).
func (c Credentials) File() string {
	b, _ := jwt.FormatUserConfig(c.JWT, []byte(c.Seed)) // a JWT and a seed made here always format
	return string(b)
}

// NATSOptions are the connect options that use the credentials.
func (c Credentials) NATSOptions() []nats.Option {
	opts := []nats.Option{nats.UserJWTAndSeed(c.JWT, c.Seed)}
	if c.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	return opts
}

// ComponentCredentials mints the credentials of a fanin component (gateway, runtime, autoscaler,
// an operator's CLI): every subject of the fanin account.
func (a *Authority) ComponentCredentials(name string) (Credentials, error) {
	return mintUser(a.signer, pub(a.account), name, nil, "", 0)
}

// SystemCredentials mints a user of the system account: the gateway uses it to push account
// updates (job accounts, revocations) and to watch authentication failures.
func (a *Authority) SystemCredentials(name string) (Credentials, error) {
	return mintUser(a.system, "", name, nil, "", 0)
}

// mintUser makes a user signed by signer, a key of the account issuerAccount ("" when signer is
// the account's own key).
func mintUser(signer nkeys.KeyPair, issuerAccount, name string, perms *jwt.Permissions, inbox string, ttl time.Duration, tags ...string) (Credentials, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return Credentials{}, err
	}
	uc := jwt.NewUserClaims(pub(kp))
	uc.Name = name
	uc.IssuerAccount = issuerAccount
	uc.Tags.Add(tags...)
	if perms != nil {
		uc.Permissions = *perms
	}
	c := Credentials{User: pub(kp), InboxPrefix: inbox}
	if ttl > 0 {
		c.Expires = time.Now().Add(ttl).Truncate(time.Second)
		uc.Expires = c.Expires.Unix()
	}
	if c.JWT, err = uc.Encode(signer); err != nil {
		return Credentials{}, fmt.Errorf("sign user %s: %w", name, err)
	}
	seed, _ := kp.Seed()
	c.Seed = string(seed)
	return c, nil
}

// JobOf returns the job a user JWT says it was minted for and the key that signed it, or "" when it
// names no job. The JWT is decoded, not trusted: check the issuer against the job's account
// (JobAccountKey) before attributing anything to the job, and never grant anything from it.
func (a *Authority) JobOf(userJWT string) (job, issuer string) {
	uc, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return "", ""
	}
	for _, t := range uc.Tags {
		if j, ok := strings.CutPrefix(t, jobTagPrefix); ok {
			return j, uc.Issuer
		}
	}
	return "", ""
}

// Revoke revokes users (their credentials issued until now) and returns the fanin account's new
// JWT, which must reach the server (PushAccount) to take effect.
func (a *Authority) Revoke(at time.Time, users ...string) (string, error) {
	a.mu.Lock()
	for _, u := range users {
		if nkeys.IsValidPublicUserKey(u) && at.Unix() > a.revoked[u] {
			a.revoked[u] = at.Unix()
		}
	}
	a.mu.Unlock()
	return a.AccountJWT()
}

// Revoked lists the revoked users, sorted.
func (a *Authority) Revoked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.revoked))
	for u := range a.revoked {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// PushAccount sends the fanin account's JWT to the servers (PushAccountJWT).
func (a *Authority) PushAccount(ctx context.Context, sys *nats.Conn, accountJWT string) error {
	return PushAccountJWT(ctx, sys, accountJWT)
}
