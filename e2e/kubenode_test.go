package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fanin-ml/fanin/gateway/api"
	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/job"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/sdk"
	"github.com/fanin-ml/fanin/wire"
)

// The node test's environment: what `scripts/kube-node.sh up` prints.
const (
	envNodeKubeconfig = "FANIN_KUBE_NODE"  // the node's admin kubeconfig
	envNodeImage      = "FANIN_NODE_IMAGE" // fanin's image, imported into the node's containerd
	envKubeBins       = "FANIN_KUBE"       // the directory of kubectl (scripts/kube.sh --node)
)

// nodePolicy makes the test's small load look large to the autoscaler (as burstPolicy does), so
// that it grows the runtime Deployment within seconds, holds it while the load lasts and shrinks it
// once the load is gone: one grow, one shrink. The runtimes' size is set (one core: what their 100m
// request rounds up to) rather than taken from their reports. The load's measured demand is noisy
// on this shared machine: from one decision to the next it went between 0.015 and 0.074 cores,
// against one runtime's 0.02 (2% of a core). With a stable window of 3 s the pool followed those
// dips, as the policy said it should (the decider sizes for the peak within the window): 2, 3, 2,
// 3, 2 during the load. The default window of 30 s is longer than any dip, and max_runtimes 2
// makes the grow one step and the shrink one step.
const nodePolicy = `
min_runtimes: 1
max_runtimes: 2
cores_per_runtime: 1
target_utilization: 0.02
stable_window: 30s
scale_down_cooldown: 1s
panic_window: 2s
startup_grace: 1s
`

// kubeNode is the one-node cluster of scripts/kube-node.sh.
type kubeNode struct {
	t          *testing.T
	kubeconfig string
	kubectlBin string
	cs         kubernetes.Interface
}

func (k *kubeNode) kubectl(args ...string) (string, error) {
	cmd := exec.Command(k.kubectlBin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (k *kubeNode) mustKubectl(args ...string) string {
	k.t.Helper()
	out, err := k.kubectl(args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// reset removes fanin from the cluster: the namespace with everything in it, and the volumes its
// NATS servers claimed, emptied and made available again (the storage class keeps released volumes,
// reclaimPolicy Retain, and the node's are directories on this host).
func (k *kubeNode) reset() error {
	ctx := context.Background()
	err := k.cs.CoreV1().Namespaces().Delete(ctx, "fanin", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	// The runtimes' grace period is 60 s for their checkpoint; here nothing needs one.
	grace := int64(0)
	_ = k.cs.CoreV1().Pods("fanin").DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &grace}, metav1.ListOptions{})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, err := k.cs.CoreV1().Namespaces().Get(ctx, "fanin", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace fanin still there after 3 minutes: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	pvs, err := k.cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, pv := range pvs.Items {
		if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != "fanin" || pv.Spec.HostPath == nil {
			continue
		}
		dir := pv.Spec.HostPath.Path
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("volume %s: %w", pv.Name, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
		pv.Spec.ClaimRef = nil
		if _, err := k.cs.CoreV1().PersistentVolumes().Update(ctx, &pv, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("volume %s: %w", pv.Name, err)
		}
	}
	return nil
}

// diagnose logs the pods and the tail of each one's log.
func (k *kubeNode) diagnose() {
	out, _ := k.kubectl("-n", "fanin", "get", "pods", "-o", "wide")
	k.t.Logf("pods:\n%s", out)
	pods, err := k.cs.CoreV1().Pods("fanin").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		out, _ := k.kubectl("-n", "fanin", "logs", p.Name, "--tail", "25")
		k.t.Logf("%s:\n%s", p.Name, out)
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount > 0 { // why the last one exited
				out, _ := k.kubectl("-n", "fanin", "logs", p.Name, "-c", c.Name, "--previous", "--tail", "25")
				k.t.Logf("%s/%s before its restart (%d restarts):\n%s", p.Name, c.Name, c.RestartCount, out)
			}
		}
	}
}

// serviceURL is the address of a Service's first port: its cluster IP, which kube-proxy routes from
// this host too.
func (k *kubeNode) serviceURL(scheme, name string) string {
	k.t.Helper()
	svc, err := k.cs.CoreV1().Services("fanin").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	return fmt.Sprintf("%s://%s:%d", scheme, svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// trainUntil trains step by step until done returns nil (checked after each step; 3 minutes at
// most), then 5 steps more, and returns the longest step.
func (k *kubeNode) trainUntil(step func() time.Duration, done func() error) time.Duration {
	k.t.Helper()
	var longest time.Duration
	deadline := time.Now().Add(3 * time.Minute)
	for {
		longest = max(longest, step())
		err := done()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			k.t.Fatal(err)
		}
	}
	for range 5 {
		longest = max(longest, step())
	}
	return longest
}

// gone is nil once pod p no longer exists.
func (k *kubeNode) gone(p *corev1.Pod) error {
	cur, err := k.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && cur.UID != p.UID) {
		return nil
	}
	return fmt.Errorf("pod %s still there after 3 minutes (err %v)", p.Name, err)
}

// replaced is nil once pod p (a StatefulSet's) has been replaced by a Ready pod of its name.
func (k *kubeNode) replaced(p *corev1.Pod) error {
	cur, err := k.cs.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if cur.UID == p.UID {
		return fmt.Errorf("pod %s not replaced after 3 minutes", p.Name)
	}
	for _, c := range cur.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s replaced but not Ready after 3 minutes", p.Name)
}

// restarts lists the containers that restarted: a component that exits while another starts
// (NATS) costs a crash-loop back-off.
func (k *kubeNode) restarts() []string {
	pods, err := k.cs.CoreV1().Pods("fanin").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	var r []string
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount > 0 {
				r = append(r, fmt.Sprintf("%s/%s: %d", p.Name, c.Name, c.RestartCount))
			}
		}
	}
	return r
}

// attackTarget is the deployment as runAttacks attacks it: through the NATS and gateway Services,
// observed with a component user of fanin's account; counters are summed over the runtime pods'
// metrics ports, and memory over the NATS servers and the runtimes (their processes' resident
// memory, as each reports it: there is no one process like fanin dev's).
func (k *kubeNode) attackTarget(natsURL, api string, admin *sdk.Admin, authDir string) attackTarget {
	authority, err := auth.Load(authDir)
	if err != nil {
		k.t.Fatal(err)
	}
	observer, err := authority.ComponentCredentials("e2e-observer")
	if err != nil {
		k.t.Fatal(err)
	}
	return attackTarget{
		natsURL: natsURL, apiURL: api, admin: admin, observer: observer.NATSOptions(),
		metrics: func() ([]string, error) {
			ips, err := k.podIPs("fanin-runtime")
			for i, ip := range ips {
				ips[i] = "http://" + ip + ":9464/metrics"
			}
			return ips, err
		},
		memory:   k.memory,
		memoryOf: "the resident memory of the NATS servers (/varz mem) and the runtimes (process_resident_memory_bytes) together",
	}
}

// scrapeTargets scrapes every runtime the gateway lists for Prometheus (GET /v1/metrics/targets),
// as a Prometheus in the cluster would: every running runtime pod is listed, at an address
// reachable in the cluster, and serves the runtime's metrics there.
func (k *kubeNode) scrapeTargets(gw, token string) {
	k.t.Helper()
	testutil.CheckFor(k.t, 30*time.Second, 500*time.Millisecond, func() error {
		req, err := http.NewRequest("GET", gw+"/v1/metrics/targets", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var groups []api.TargetGroup
		if err := json.NewDecoder(resp.Body).Decode(&groups); err != nil {
			return fmt.Errorf("GET /v1/metrics/targets: %s: %w", resp.Status, err)
		}
		pods, err := k.runningPods("fanin-runtime")
		if err != nil {
			return err
		}
		listed := map[string]string{} // runtime id: target
		for _, g := range groups {
			for _, tg := range g.Targets {
				listed[g.Labels["fanin_runtime_id"]] = tg
			}
		}
		for _, p := range pods {
			tg, ok := listed[p.Name]
			if !ok {
				return fmt.Errorf("runtime pod %s is not among the metrics targets %v", p.Name, listed)
			}
			if tg != p.Status.PodIP+":9464" {
				return fmt.Errorf("runtime pod %s is listed at %s, want its IP %s:9464", p.Name, tg, p.Status.PodIP)
			}
			m, err := http.Get("http://" + tg + "/metrics")
			if err != nil {
				return fmt.Errorf("scrape %s: %w", p.Name, err)
			}
			body, err := io.ReadAll(m.Body)
			m.Body.Close()
			if err != nil || m.StatusCode != http.StatusOK || !strings.Contains(string(body), "fanin_runtime_") {
				return fmt.Errorf("scrape %s at %s: %s, %v, %d bytes without fanin_runtime_", p.Name, tg, m.Status, err, len(body))
			}
		}
		k.t.Logf("Prometheus's service discovery lists the %d runtime pods at their IPs; each serves its metrics there", len(pods))
		return nil
	})
}

// podIPs are the addresses of the running pods of app (app.kubernetes.io/name), not being deleted.
func (k *kubeNode) podIPs(app string) ([]string, error) {
	pods, err := k.runningPods(app)
	var ips []string
	for _, p := range pods {
		ips = append(ips, p.Status.PodIP)
	}
	return ips, err
}

// runningPods are the running pods of app (app.kubernetes.io/name) that have an address and are
// not being deleted.
func (k *kubeNode) runningPods(app string) ([]corev1.Pod, error) {
	pods, err := k.cs.CoreV1().Pods("fanin").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
	if err != nil {
		return nil, err
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return nil, fmt.Errorf("no running pod of %s", app)
	}
	return running, nil
}

// memory adds up the resident memory of the NATS servers and of the runtimes, and logs each one's.
func (k *kubeNode) memory() (int64, error) {
	var sum int64
	var parts []string
	servers, err := k.runningPods("nats")
	if err != nil {
		return 0, err
	}
	for _, p := range servers {
		var varz struct {
			Mem int64 `json:"mem"`
		}
		resp, err := http.Get("http://" + p.Status.PodIP + ":8222/varz")
		if err != nil {
			return 0, err
		}
		err = json.NewDecoder(resp.Body).Decode(&varz)
		resp.Body.Close()
		if err != nil || varz.Mem == 0 {
			return 0, fmt.Errorf("%s /varz: mem %d, %v", p.Name, varz.Mem, err)
		}
		sum += varz.Mem
		parts = append(parts, fmt.Sprintf("%s %d MiB", p.Name, varz.Mem>>20))
	}
	runtimes, err := k.runningPods("fanin-runtime")
	if err != nil {
		return 0, err
	}
	for _, p := range runtimes {
		resp, err := http.Get("http://" + p.Status.PodIP + ":9464/metrics")
		if err != nil {
			return 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, err
		}
		rss := int64(0)
		for line := range strings.SplitSeq(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "process_resident_memory_bytes "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				rss = int64(f)
			}
		}
		if rss == 0 {
			return 0, fmt.Errorf("runtime %s reports no process_resident_memory_bytes", p.Name)
		}
		sum += rss
		parts = append(parts, fmt.Sprintf("%s %d MiB", p.Name, rss>>20))
	}
	k.t.Logf("resident memory: %s", strings.Join(parts, ", "))
	return sum, nil
}

// firstStarted is when the first running container of app's pods started.
func (k *kubeNode) firstStarted(app string) time.Time {
	k.t.Helper()
	pods, err := k.cs.CoreV1().Pods("fanin").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
	if err != nil {
		k.t.Fatal(err)
	}
	var first time.Time
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if r := c.State.Running; r != nil && (first.IsZero() || r.StartedAt.Time.Before(first)) {
				first = r.StartedAt.Time
			}
		}
	}
	if first.IsZero() {
		k.t.Fatalf("no running container of %s", app)
	}
	return first
}

// runtimeReplicas is the runtime Deployment's spec.replicas: what the autoscaler asked for.
func (k *kubeNode) runtimeReplicas() (int, error) {
	s, err := k.cs.AppsV1().Deployments("fanin").GetScale(context.Background(), "fanin-runtime", metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	return int(s.Spec.Replicas), nil
}

// TestKubeNode deploys fanin on a real one-node cluster (scripts/kube-node.sh: kubelet, containerd,
// runc, CNI, kube-proxy, CoreDNS) as docs/KUBERNETES.md says, secured, and trains through it:
//
//   - `fanin auth init` and the Secret fanin-auth from its directory, then `kubectl apply -k` of
//     an overlay that only sets the image (imported into the node) and smaller runtime requests;
//   - every pod Ready; the three NATS servers route to each other by their DNS names (CoreDNS) and
//     give fanin's state 3 replicas;
//   - nothing connects to NATS without credentials, the API refuses a request without a token, and
//     one job's credentials do not open another job; then TestAttacks' suite (runAttacks) attacks
//     the deployment through its Services while two victim jobs train, each attack followed by
//     bit-exact steps of the victims and of the attacker's own job;
//   - a job created through the gateway's Service trains with its credentials, from workers on this
//     host (through the NATS Service), bit-exact against the reference, from apply to the first
//     step without a manual step;
//   - deleting the runtime pod that serves it, and then the NATS pod that holds its parameters
//     (one replica: the stream is on that server's volume alone), mid-training, changes no bit,
//     nor does rolling the runtime Deployment (an upgrade); the step gaps are logged;
//   - under load the autoscaler grows the runtime Deployment, and shrinks it once the load is gone.
//
// It runs where scripts/kube-node.sh runs (root, this machine's network): CI's node lane starts the
// node, exports the variables it prints, and stops it after.
func TestKubeNode(t *testing.T) {
	skipShort(t)
	kc, img, bins := os.Getenv(envNodeKubeconfig), os.Getenv(envNodeImage), os.Getenv(envKubeBins)
	if kc == "" || img == "" || bins == "" {
		t.Skipf("%s, %s or %s is not set: start a node with scripts/kube-node.sh up and export what it prints, as %s=$KUBECONFIG (CI's node lane does)",
			envNodeKubeconfig, envNodeImage, envKubeBins, envNodeKubeconfig)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubeNode{t: t, kubeconfig: kc, kubectlBin: filepath.Join(bins, "kubectl"), cs: cs}
	if err := k.reset(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			k.diagnose()
		}
		if err := k.reset(); err != nil {
			t.Errorf("removing fanin from the node: %v", err)
		}
	})
	ctx := context.Background()

	// The Secret, as docs/KUBERNETES.md says.
	authDir := filepath.Join(t.TempDir(), "fanin-auth")
	if out, err := exec.Command(faninBin, "auth", "init", "--dir", authDir, "--resolver-dir", "/data/accounts").CombinedOutput(); err != nil {
		t.Fatalf("fanin auth init: %v\n%s", err, out)
	}
	manifests, err := filepath.Abs("../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	k.mustKubectl("apply", "-f", filepath.Join(manifests, "namespace.yaml"))
	k.mustKubectl("-n", "fanin", "create", "secret", "generic", "fanin-auth", "--from-file="+authDir)

	// The overlay a platform team writes: the image, and requests that fit a 2-core node.
	name, tag, ok := strings.Cut(img, ":")
	if !ok {
		t.Fatalf("%s=%s: want NAME:TAG", envNodeImage, img)
	}
	overlay := t.TempDir()
	base, err := filepath.Rel(overlay, manifests) // kustomize takes no absolute path
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [%q]
images:
  - name: fanin
    newName: %s
    newTag: %s
patches:
  - target: {kind: Deployment, name: fanin-runtime}
    patch: |
      - op: replace
        path: /spec/template/spec/containers/0/resources/requests
        value: {cpu: 100m, memory: 256Mi}
`, base, name, tag)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	k.mustKubectl("apply", "-k", overlay)
	for _, w := range []string{"statefulset/nats", "deployment/fanin-gateway", "deployment/fanin-autoscaler", "deployment/fanin-runtime"} {
		k.mustKubectl("-n", "fanin", "rollout", "status", w, "--timeout", "4m")
	}
	t.Logf("every pod Ready %v after kubectl apply", time.Since(applied).Round(time.Second))
	if r := k.restarts(); len(r) > 0 {
		t.Errorf("containers restarted while the deployment started: %v", r)
	}

	// The NATS servers found each other by DNS: each routes to the other two.
	pods, err := cs.CoreV1().Pods("fanin").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nats"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		var routez struct {
			Routes []struct {
				RemoteName string `json:"remote_name"`
			} `json:"routes"`
		}
		testutil.CheckFor(t, 60*time.Second, 500*time.Millisecond, func() error {
			resp, err := http.Get(fmt.Sprintf("http://%s:8222/routez", p.Status.PodIP))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if err := json.NewDecoder(resp.Body).Decode(&routez); err != nil {
				return err
			}
			var peers []string
			for _, r := range routez.Routes {
				if r.RemoteName != p.Name && !slices.Contains(peers, r.RemoteName) {
					peers = append(peers, r.RemoteName)
				}
			}
			if len(peers) != 2 {
				return fmt.Errorf("%s routes to %v, want the two other servers", p.Name, peers)
			}
			return nil
		})
		// Tagged with its node, as the runtimes there name it.
		var varz struct {
			Tags []string `json:"tags"`
		}
		resp, err := http.Get(fmt.Sprintf("http://%s:8222/varz", p.Status.PodIP))
		if err != nil {
			t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&varz)
		resp.Body.Close()
		if err != nil || !slices.Contains(varz.Tags, wire.NodeTag(p.Spec.NodeName)) {
			t.Errorf("%s on node %s: tags %v (%v), want %s", p.Name, p.Spec.NodeName, varz.Tags, err, wire.NodeTag(p.Spec.NodeName))
		}
	}
	natsOn := map[string]string{} // server -> its node
	for _, p := range pods.Items {
		natsOn[p.Name] = p.Spec.NodeName
	}

	natsURL, api := k.serviceURL("nats", "nats"), k.serviceURL("http", "fanin-gateway")
	if nc, err := nats.Connect(natsURL); err == nil {
		nc.Close()
		t.Fatal("connected to the cluster's NATS without credentials")
	}
	op, err := nats.Connect(natsURL, nats.UserCredentials(filepath.Join(authDir, "operator.creds")))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		if r := store.StateReplicas(op); r != 3 {
			return fmt.Errorf("StateReplicas %d through the Service (servers known: %v), want 3", r, op.Servers())
		}
		return nil
	})
	js, err := jetstream.New(op)
	if err != nil {
		t.Fatal(err)
	}

	// kube-proxy programs the Service's rules a moment after the pods are Ready: until then a
	// connection is refused.
	testutil.CheckFor(t, 30*time.Second, 200*time.Millisecond, func() error {
		if _, err := sdk.NewAdmin(api).Jobs(ctx); !errors.Is(err, wire.ErrReason(wire.ReasonUnauthorized)) {
			return fmt.Errorf("the API without a token: %v, want unauthorized", err)
		}
		return nil
	})
	token, err := os.ReadFile(filepath.Join(authDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	admin := sdk.NewAdmin(api, sdk.WithToken(strings.TrimSpace(string(token))))
	spec := clusterSpec("kube", "adam")
	spec.Storage = "file"
	spec.GradientStreams = 2 // placed by the servers' node tags
	created, err := admin.SubmitJob(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	other := clusterSpec("kube-other", "sgd")
	if _, err := admin.SubmitJob(ctx, other); err != nil {
		t.Fatal(err)
	}
	quiet := sdk.WithNATSOptions(nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	probe, err := sdk.Connect(ctx, natsURL, sdk.WithJobCredentials(created.Credentials), quiet)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	if _, err := probe.Worker(short, other.ID, 0); err == nil {
		t.Fatalf("job %s's credentials opened job %s", spec.ID, other.ID)
	}
	cancel()
	probe.Close()

	// Deleting a job at the end closes its account: its workers' reconnections are refused.
	creds := []sdk.Option{sdk.WithJobCredentials(created.Credentials), quiet}
	tr := newTrainerWith(t, natsURL, &created.Record, creds)
	tr.onStall = k.diagnose
	tr.run(1)
	t.Logf("first step trained %v after kubectl apply, %v after the first runtime container started",
		time.Since(applied).Round(time.Second), time.Since(k.firstStarted("fanin-runtime")).Round(time.Second))
	// Each runtime reports its node and is connected to a server of that node (nats-local).
	pool, err := admin.Pool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range pool.Runtimes {
		if rt.Reported != nil && natsOn[rt.Server] != rt.Node {
			t.Errorf("runtime %s on node %q is connected to %s on node %q, want a server of its own node", rt.ID, rt.Node, rt.Server, natsOn[rt.Server])
		}
	}

	// TestAttacks' suite, against the deployment.
	t.Run("attacks", func(t *testing.T) { runAttacks(t, k.attackTarget(natsURL, api, admin, authDir)) })
	tr.run(10)
	// Under the default policy, one small job and the attack suite's probes need one runtime: a
	// pool that grew here planned more than its runtimes spend (a runtime's idle CPU taken for its
	// shards' once made it 17 pods).
	if n, err := k.runtimeReplicas(); err != nil {
		t.Fatal(err)
	} else if n != 1 {
		t.Errorf("the runtime Deployment has %d replicas for one small job, want 1", n)
	}

	// step runs one step and returns how long it took.
	step := func() time.Duration {
		start := time.Now()
		tr.run(tr.step + 1)
		return time.Since(start)
	}
	var normal time.Duration
	for range 5 {
		normal = max(normal, step())
	}
	k.scrapeTargets(api, strings.TrimSpace(string(token)))

	// The runtime pod that serves the job: deleted (SIGTERM: it checkpoints and hands over).
	pl, err := admin.Placement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var serving string
	for _, p := range pl {
		if p.Job == spec.ID && p.Runtime != "" {
			serving = p.Runtime
		}
	}
	if serving == "" {
		t.Fatalf("no runtime serves job %s: %+v", spec.ID, pl)
	}
	old, err := cs.CoreV1().Pods("fanin").Get(ctx, serving, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k.mustKubectl("-n", "fanin", "delete", "pod", serving, "--wait=false")
	gap := k.trainUntil(step, func() error { return k.gone(old) })
	t.Logf("runtime pod %s deleted mid-training: longest step %v (before: %v)", serving, gap.Round(time.Millisecond), normal.Round(time.Millisecond))

	// The NATS pod that holds the job's parameters, its only replica: the stream comes back from
	// that pod's volume, or training could not go on.
	info, err := js.Stream(ctx, wire.ParamsStream(spec.ID))
	if err != nil {
		t.Fatal(err)
	}
	si, err := info.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holder := si.Cluster.Leader
	if si.Config.Replicas != 1 || !strings.HasPrefix(holder, "nats-") {
		t.Fatalf("stream %s: %d replicas on %q, want 1 on a nats pod", si.Config.Name, si.Config.Replicas, holder)
	}
	msgs := si.State.Msgs
	before, err := cs.CoreV1().Pods("fanin").Get(ctx, holder, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	k.mustKubectl("-n", "fanin", "delete", "pod", holder, "--wait=false")
	gap = k.trainUntil(step, func() error { return k.replaced(before) })
	testutil.CheckFor(t, 30*time.Second, 500*time.Millisecond, func() error {
		if si, err = info.Info(ctx); err != nil {
			return err
		}
		if si.Cluster == nil || si.Cluster.Leader != holder || si.State.Msgs < msgs {
			return fmt.Errorf("stream %s after its server's pod was replaced: on %+v with %d messages, want on %s with at least %d",
				si.Config.Name, si.Cluster, si.State.Msgs, holder, msgs)
		}
		return nil
	})
	t.Logf("NATS pod %s (the parameters' only replica) deleted mid-training: longest step %v; its stream came back from its volume with %d messages",
		holder, gap.Round(time.Millisecond), si.State.Msgs)
	tr.run(tr.step + 5)

	// An upgrade: the runtime Deployment rolled (new pods, one at a time; each old one hands its
	// shards over on SIGTERM).
	k.mustKubectl("-n", "fanin", "rollout", "restart", "deployment/fanin-runtime")
	rolled := make(chan error, 1)
	go func() {
		_, err := k.kubectl("-n", "fanin", "rollout", "status", "deployment/fanin-runtime", "--timeout", "4m")
		rolled <- err
	}()
	gap = 0
	for done := false; !done; {
		gap = max(gap, step())
		select {
		case err := <-rolled:
			if err != nil {
				t.Fatal(err)
			}
			done = true
		default:
		}
	}
	tr.run(tr.step + 5)
	t.Logf("runtime Deployment rolled during training: longest step %v", gap.Round(time.Millisecond))

	// Under load the autoscaler grows the runtime Deployment, and shrinks it after.
	if _, err := admin.SetPolicy(ctx, []byte(nodePolicy)); err != nil {
		t.Fatal(err)
	}
	load := job.Spec{ID: "kube-load", Ranks: 4, ShardSize: 256 << 10, Tensors: []job.Tensor{{Name: "w", Shape: []int{1 << 20}}},
		Function: job.Function{Name: "sgd", Hyper: map[string]float64{"lr": 0.01}}, Init: job.Init{Kind: "uniform", Seed: 3, Scale: 0.1}}
	loadJob, err := admin.SubmitJob(ctx, load)
	if err != nil {
		t.Fatal(err)
	}
	lt := newTrainerWith(t, natsURL, &loadJob.Record, []sdk.Option{sdk.WithJobCredentials(loadJob.Credentials), quiet})
	lt.onStall = k.diagnose
	loadStart := time.Now()
	// The replicas the autoscaler asked for, as they changed, and the changes: +1 a grow, -1 a
	// shrink.
	var timeline []string
	var changes []int
	last := 1
	watch := func() {
		n, err := k.runtimeReplicas()
		if err != nil || n == last {
			return
		}
		timeline = append(timeline, fmt.Sprintf("%v: %d", time.Since(loadStart).Round(100*time.Millisecond), n))
		if n > last {
			changes = append(changes, +1)
		} else {
			changes = append(changes, -1)
		}
		last = n
	}
	grown := time.Now()
	for lt.step < 300 && last < 2 {
		lt.run(lt.step + 1)
		if watch(); last >= 2 {
			grown = time.Now()
		}
	}
	if last < 2 {
		t.Fatalf("the runtime Deployment stayed at 1 replica through %d steps of load", lt.step)
	}
	grewAt := lt.step
	for range 30 { // bit-exact while the pool grows and shards move
		lt.run(lt.step + 1)
		watch()
	}
	t.Logf("under load the autoscaler grew the runtime Deployment to %d replicas at step %d, %v after the load began",
		last, grewAt, grown.Sub(loadStart).Round(100*time.Millisecond))
	loadEnd := time.Since(loadStart).Round(100 * time.Millisecond)
	during := len(changes)
	for _, id := range []string{load.ID, spec.ID, other.ID} {
		if err := admin.DeleteJob(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	testutil.CheckFor(t, 3*time.Minute, 200*time.Millisecond, func() error {
		if watch(); last != 1 {
			return fmt.Errorf("runtime Deployment at %d replicas %v after the load ended, want 1", last, time.Since(stopped).Round(time.Second))
		}
		return nil
	})
	t.Logf("the runtime Deployment shrank back to 1 replica %v after the load ended (%v after it grew); replicas over time (since the load began; it ended at %v): %s",
		time.Since(stopped).Round(time.Second), time.Since(grown).Round(time.Second), loadEnd, strings.Join(timeline, ", "))
	// One grow under the load, one shrink after it: a shrink while the load lasts, or a second
	// grow, is the pool flapping.
	if !slices.Equal(changes, []int{+1, -1}) || during != 1 {
		t.Errorf("the pool changed %d times during the load and %d after, want one grow and then one shrink: %s",
			during, len(changes)-during, strings.Join(timeline, ", "))
	}
	logDecisions(t, admin, loadStart)
}

// logDecisions logs the autoscaler's decisions since from (those that changed something): when,
// the runtimes wanted, the demand, and the reason that sized the pool.
func logDecisions(t *testing.T, admin *sdk.Admin, from time.Time) {
	t.Helper()
	ds, err := admin.Decisions(context.Background(), 1000)
	if err != nil {
		t.Logf("decisions: %v", err)
		return
	}
	var lines []string
	for _, d := range ds {
		if d.At.Before(from) {
			continue
		}
		var why []string
		for _, r := range d.Reasons {
			if strings.HasPrefix(r, "demand ") || strings.Contains(r, "scale down") || strings.Contains(r, "panic") ||
				strings.Contains(r, "cooldown") || strings.Contains(r, "fit on no runtime") || strings.HasPrefix(r, "holding") {
				why = append(why, r)
			}
		}
		lines = append(lines, fmt.Sprintf("%v desired %d demand %.3f %s: %s", d.At.Sub(from).Round(100*time.Millisecond), d.Desired, d.Demand, d.Mode, strings.Join(why, "; ")))
	}
	t.Logf("the autoscaler's decisions since the load began:\n%s", strings.Join(lines, "\n"))
}
