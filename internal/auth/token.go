package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// Kind is what an API token may do.
type Kind string

// Token kinds. An admin token (operators) may do everything; a team token creates jobs within its
// quotas and manages the jobs it created; a job token reaches one job.
const (
	KindAdmin Kind = "admin"
	KindTeam  Kind = "team"
	KindJob   Kind = "job"
)

const tokenPrefix = "fanin_"

// NewToken returns a new random bearer token of the kind: "fanin_<kind>_" and 256 random bits.
func NewToken(k Kind) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return tokenPrefix + string(k) + "_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// HashToken is how a token is stored and looked up: its SHA-256 in hex. Tokens are 256 random
// bits, so a fast hash is enough; the gateway never stores a token itself.
func HashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// Equal compares two tokens in constant time.
func Equal(a, b string) bool {
	return len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// Redact shows enough of a token to recognize it in a listing, never enough to use it.
func Redact(tok string) string {
	if i := strings.LastIndexByte(tok, '_'); i >= 0 && len(tok)-i > 5 {
		return tok[:i+5] + "…"
	}
	return "…"
}
