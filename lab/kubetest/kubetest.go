package kubetest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// EnvVar names the environment variable holding the binaries' directory.
const EnvVar = "FANIN_KUBE"

// AdminToken is the bearer token of the cluster's administrator (group system:masters).
const AdminToken = "fanin-admin-token"

// User is a user of the static token file: tests authenticate as it with its Token. A ServiceAccount
// is impersonated by Name "system:serviceaccount:NS:NAME" and its groups, which RBAC bindings to
// that ServiceAccount match.
type User struct {
	Name   string
	Token  string
	Groups []string
}

// ServiceAccount returns the User that RBAC takes for ServiceAccount namespace/name.
func ServiceAccount(namespace, name, token string) User {
	return User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Token:  token,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
}

// Options says what to start besides etcd and the apiserver.
type Options struct {
	ControllerManager bool   // run the deployment and replicaset controllers, which create and delete pods
	Users             []User // besides the administrator
}

// Cluster is a running control plane; Start stops it when the test ends.
type Cluster struct {
	Host   string // https://127.0.0.1:PORT
	CAData []byte // PEM of the CA that signed the apiserver's certificate
	dir    string
}

// BinDir returns the directory of the kube binaries from $FANIN_KUBE, or skips the test.
func BinDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(EnvVar)
	if dir == "" {
		t.Skipf("%s is not set: build kube-apiserver, kube-controller-manager and etcd with FANIN_KUBE=$(scripts/kube.sh) (cached in ~/.cache/fanin; .ci/run does it)", EnvVar)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("%s=%s: %v (run scripts/kube.sh)", EnvVar, dir, err)
		}
	}
	return dir
}

// Start runs etcd and kube-apiserver (RBAC authorization, static token authentication) and, if
// asked, kube-controller-manager, and waits until the apiserver is ready. There is no scheduler and
// no kubelet: pods stay Pending and unassigned.
func Start(t testing.TB, bins string, opts Options) *Cluster {
	t.Helper()
	dir := t.TempDir()
	c := &Cluster{dir: dir}
	start := time.Now()

	etcdPort, peerPort, apiPort := testutil.FreePort(t), testutil.FreePort(t), testutil.FreePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	run(t, dir, filepath.Join(bins, "etcd"), "etcd",
		"--name=kubetest", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL, "--unsafe-no-fsync", "--log-level=warn")

	caPEM, certFile, keyFile := servingCert(t, dir)
	c.CAData = caPEM
	saKey := filepath.Join(dir, "sa.key")
	writeRSAKey(t, saKey)
	tokens := []string{AdminToken + ",admin,admin,system:masters"}
	for _, u := range opts.Users {
		tokens = append(tokens, fmt.Sprintf("%s,%s,%s,%q", u.Token, u.Name, u.Name, strings.Join(u.Groups, ",")))
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(tokens, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	run(t, dir, filepath.Join(bins, "kube-apiserver"), "kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(apiPort),
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+tokenFile, "--anonymous-auth=false",
		"--authorization-mode=RBAC",
		"--service-account-issuer="+c.Host, "--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		// The ServiceAccount admission plugin needs each namespace's "default" ServiceAccount, which
		// the serviceaccount controller (not started here) creates.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false")
	c.waitReady(t)

	if opts.ControllerManager {
		kubeconfig := filepath.Join(dir, "kcm.kubeconfig")
		if err := c.WriteKubeconfig(kubeconfig, AdminToken); err != nil {
			t.Fatal(err)
		}
		run(t, dir, filepath.Join(bins, "kube-controller-manager"), "kube-controller-manager",
			"--kubeconfig="+kubeconfig, "--authentication-kubeconfig="+kubeconfig, "--authorization-kubeconfig="+kubeconfig,
			"--controllers=deployment-controller,replicaset-controller",
			"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(testutil.FreePort(t)),
			"--cert-dir="+filepath.Join(dir, "kcm-certs"))
	}
	t.Logf("kubetest: control plane at %s ready in %v", c.Host, time.Since(start).Round(time.Millisecond))
	return c
}

// Config returns a client configuration that authenticates with token.
func (c *Cluster) Config(token string) *rest.Config {
	return &rest.Config{
		Host:            c.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData},
		QPS:             100,
		Burst:           200,
	}
}

// Client returns a clientset that authenticates with token.
func (c *Cluster) Client(t testing.TB, token string) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// WriteKubeconfig writes a kubeconfig file for the cluster that authenticates with token.
func (c *Cluster) WriteKubeconfig(path, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "user"}
	cfg.CurrentContext = "kubetest"
	return clientcmd.WriteToFile(*cfg, path)
}

func (c *Cluster) waitReady(t testing.TB) {
	t.Helper()
	cs := c.Client(t, AdminToken)
	deadline := time.Now().Add(90 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			return
		}
		last = fmt.Errorf("%v %s", err, body)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("kube-apiserver not ready after 90s: %v\n%s", last, tail(filepath.Join(c.dir, "kube-apiserver.log")))
}

// run starts a binary with its output in dir/name.log and stops it (SIGTERM, then SIGKILL after
// 10s) when the test ends; the log's tail is printed if the test failed.
func run(t testing.TB, dir, bin, name string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // owned by the cleanup below, which waits for it
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		logf.Close()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, tail(logPath))
		}
	})
}

func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// servingCert writes a CA and an apiserver serving certificate for 127.0.0.1 and localhost signed
// by it, and returns the CA's PEM and the certificate and key files.
func servingCert(t testing.TB, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubetest-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}, DNSNames: []string{"localhost", "kubernetes.default.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	certFile, keyFile = filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return caPEM, certFile, keyFile
}

// writeRSAKey writes the key that signs and verifies ServiceAccount tokens.
func writeRSAKey(t testing.TB, path string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, path, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k))
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
