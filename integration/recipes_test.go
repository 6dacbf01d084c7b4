package integration

// Recipe tests: the files users copy (the code blocks of README.md and
// docs/*.md, and configs/) are run as written, with only host names,
// ports, paths and credentials substituted, so that a recipe that stops
// working fails a test. Each block names the test that runs it in a
// marker on the line before it: <!-- recipe: TestName -->.
// TestReadmeBlocksAreRecipes checks that every block has one.

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/greyrelay/greyrelay/integration/peers"
	"github.com/greyrelay/greyrelay/relay/relaytest"
)

// readmeBlock is one fenced code block of README.md or of a page in docs/.
type readmeBlock struct {
	File   string // README.md or docs/NAME.md, relative to the module root
	Line   int    // of the opening fence
	Lang   string // sh, yaml, python, ...
	Recipe string // the marker's name; "" without a marker
	Text   string
}

var recipeMarker = regexp.MustCompile(`^<!-- recipe: (\S+) -->$`)

// docPages returns the pages whose blocks are recipes, relative to the
// module root: README.md first, then docs/*.md by name (not docs/bench/,
// whose dated records are kept as they were measured).
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(moduleRoot(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, filepath.ToSlash(filepath.Join("docs", filepath.Base(p))))
	}
	return out
}

// readmeBlocks parses the fenced code blocks of README.md and docs/*.md
// and their markers, page by page in docPages' order.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	var blocks []readmeBlock
	for _, page := range docPages(t) {
		blocks = append(blocks, pageBlocks(t, page)...)
	}
	return blocks
}

// pageBlocks parses one page's fenced code blocks and their markers.
func pageBlocks(t *testing.T, page string) []readmeBlock {
	t.Helper()
	f, err := os.Open(filepath.Join(moduleRoot(t), page))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []readmeBlock
	var cur *readmeBlock
	prev := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.Text += line + "\n"
		case strings.HasPrefix(line, "```"):
			cur = &readmeBlock{File: page, Line: n, Lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
			if m := recipeMarker.FindStringSubmatch(strings.TrimSpace(prev)); m != nil {
				cur.Recipe = m[1]
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", page, err)
	}
	return blocks
}

// recipeBlocks returns the blocks of README.md and docs/*.md whose marker names test, in order,
// and fails when there are none.
func recipeBlocks(t *testing.T, test string) []readmeBlock {
	t.Helper()
	var out []readmeBlock
	for _, b := range readmeBlocks(t) {
		if b.Recipe == test {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Fatalf("neither README.md nor docs/*.md has a block marked <!-- recipe: %s -->", test)
	}
	return out
}

// notRunHere lists the blocks no test runs, by marker, with why.
var notRunHere = map[string]string{
	"start-here": "`go run` serves the default's fixed ports 2525 and 8025 (shared by parallel tests), " +
		"and `go test ./...` would run this test itself",
	"docker-build-public": "needs a container registry for the public Go image; TestRecipeDocker runs the offline build below it",
}

// recipeLangs are the code blocks that are commands or configuration.
var recipeLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true,
	"yaml": true, "yml": true, "python": true, "js": true, "ini": true, "toml": true, "json": true}

// configsRecipes maps every file in configs/ to the test that uses it as
// written.
var configsRecipes = map[string]string{
	"configs.go":             "TestDefault_IsValidAndLoopbackOnly", // relay/config: the embedded default
	"default.yaml":           "TestDefault_DocumentsEveryKey",
	"greyrelay.example.yaml": "TestRecipeExampleConfigs",
	"container.yaml":         "TestRecipeExampleConfigs",
	"postfix-smarthost.cf":   "TestRecipePostfixSmarthost",
	"greyrelay.service":      "TestRecipeSystemdUnit",
	"docker-compose.yml":     "TestRecipeDocker",
	"grafana-dashboard.json": "TestGrafanaDashboardUsesExportedMetrics",
	"cluster":                "TestClusterComposeFiles", // the directory: docker-compose.yml, haproxy.cfg, greyrelay.yaml
}

// TestReadmeBlocksAreRecipes: every command or configuration block of
// README.md and docs/*.md carries a marker naming the test that runs it (a test
// function of this repository that reads its blocks with recipeBlocks or
// names the marker), or one of the few blocks that cannot run here; and
// every file in configs/ has its test.
func TestReadmeBlocksAreRecipes(t *testing.T) {
	root := moduleRoot(t)
	tests := testFunctions(t, root)

	for _, b := range readmeBlocks(t) {
		if !recipeLangs[b.Lang] && b.Recipe == "" {
			continue
		}
		switch {
		case b.Recipe == "":
			t.Errorf("%s:%d: a %s block without a <!-- recipe: TestName --> marker on the line before it", b.File, b.Line, b.Lang)
		case notRunHere[b.Recipe] != "":
		case tests[b.Recipe] == "":
			t.Errorf("%s:%d: the marker names %s, which is no test function", b.File, b.Line, b.Recipe)
		case !strings.Contains(readAllTests(t, root), `recipeBlocks(t, "`+b.Recipe+`")`):
			t.Errorf("%s:%d: no test reads the block with recipeBlocks(t, %q)", b.File, b.Line, b.Recipe)
		}
	}
	for _, page := range docPages(t) {
		for _, line := range strayMarkers(t, filepath.Join(root, page)) {
			t.Errorf("%s:%d: a recipe marker not on the line before a code block's opening fence", page, line)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "configs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "_test.go") {
			continue // the package's own tests, no recipe
		}
		test := configsRecipes[e.Name()]
		switch {
		case test == "":
			t.Errorf("configs/%s: no test runs it (add it to configsRecipes with the test that does)", e.Name())
		case tests[test] == "":
			t.Errorf("configs/%s: %s is no test function", e.Name(), test)
		case e.Name() != "configs.go" && !strings.Contains(tests[test], e.Name()):
			t.Errorf("configs/%s: %s does not name the file", e.Name(), test)
		}
	}
}

// strayMarkers returns the lines of path holding a recipe marker that
// no code block follows (the next line that is not blank is no fence), so
// that a marker cannot go unread.
func strayMarkers(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stray []int
	marker := 0 // line of a marker still waiting for its fence
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case marker != 0 && strings.HasPrefix(line, "```"):
			marker = 0
		case marker != 0:
			stray = append(stray, marker)
			marker = 0
		}
		if strings.HasPrefix(line, "<!-- recipe") {
			marker = n + 1
		}
	}
	if marker != 0 {
		stray = append(stray, marker)
	}
	return stray
}

// readAllTests returns the text of every _test.go file of the module.
func readAllTests(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, "_test.go") {
			src, err := os.ReadFile(path)
			b.Write(src)
			return err
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// testFunctions maps the name of every Test function in the module to its
// source text.
func testFunctions(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != root {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && strings.HasPrefix(fn.Name.Name, "Test") {
				out[fn.Name.Name] = string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// postfixParams reads a main.cf fragment: name = value lines, comments and
// blank lines skipped, indented lines continuing the previous value.
func postfixParams(t *testing.T, path string) [][2]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#"):
		case line[0] == ' ' || line[0] == '\t':
			if len(out) == 0 {
				t.Fatalf("%s: a continuation line first: %q", path, line)
			}
			out[len(out)-1][1] += " " + strings.TrimSpace(line)
		default:
			name, value, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not a name = value line: %q", path, line)
			}
			out = append(out, [2]string{strings.TrimSpace(name), strings.TrimSpace(value)})
		}
	}
	return out
}

// TestRecipePostfixSmarthost applies configs/postfix-smarthost.cf line by
// line to a private Postfix, with greyrelay's address, the user's
// credentials and a CA file substituted, and sends mail through it:
// greyrelay must receive it over TLS with AUTH and relay it to the sink.
// A table or parameter Postfix cannot use defers the message ("local data
// error"): the test fails at once with the log line.
func TestRecipePostfixSmarthost(t *testing.T) {
	peers.Require(t, "postfix")
	t.Parallel()
	sinkIP, relayIP, clientIP := relaytest.Loopback(t), relaytest.Loopback(t), relaytest.Loopback(t)
	sink := peers.StartSink(t, sinkIP+":0", peers.SinkOptions{})
	cert := peers.NewCert(t, "relay.test", relayIP)
	cfg := rbRelay{IP: relayIP, Trusted: []string{"127.0.0.1/32"},
		Listeners: []rbListener{{Mode: "submission", Cert: cert}},
		UsersFile: rbUsersFile(t, "postfix-user", "secret", ""),
		Routes:    map[string]string{"dest.test": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))

	main := map[string]string{}
	substitute := strings.NewReplacer("relay.example.com]:587", relayIP+"]:"+portOf(r.SMTPAddr),
		"/etc/ssl/certs/ca-certificates.crt", cert.CertFile)
	for _, p := range postfixParams(t, filepath.Join(moduleRoot(t), "configs", "postfix-smarthost.cf")) {
		main[p[0]] = substitute.Replace(p[1])
	}
	if !strings.Contains(main["relayhost"], relayIP) || !strings.Contains(main["smtp_sasl_password_maps"], relayIP) {
		t.Fatalf("configs/postfix-smarthost.cf no longer names [relay.example.com]:587 in relayhost and the password map: %v", main)
	}
	client := peers.StartPostfix(t, peers.PostfixConfig{Listen: peers.FreeAddr(t, clientIP), Hostname: "client.app.test", Main: main})

	client.Sendmail(t, "app@app.test", []string{"user@dest.test"},
		[]byte("From: app@app.test\r\nTo: user@dest.test\r\nSubject: smarthost recipe\r\nMessage-ID: <recipe@app.test>\r\n\r\nhello\r\n"))
	deadline := time.Now().Add(60 * time.Second)
	for len(sink.Messages()) == 0 {
		if log := client.Log(); strings.Contains(log, "status=deferred") || strings.Contains(log, "status=bounced") {
			t.Fatalf("Postfix did not hand the message to greyrelay:\n%s", tail(log, 15))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message never reached the sink\n%s", tail(client.Log(), 15))
		}
		time.Sleep(100 * time.Millisecond)
	}
	m := sink.Messages()[0]
	if m.From != "app@app.test" || len(m.Rcpts) != 1 || m.Rcpts[0] != "user@dest.test" {
		t.Errorf("sink got <%s> -> %v", m.From, m.Rcpts)
	}
	if rcv := rbReceivedFields(m.Data); len(rcv) == 0 || !strings.Contains(rcv[0], "with ESMTPSA") {
		t.Errorf("greyrelay's Received field does not say ESMTPSA (TLS and AUTH): %q", rcv)
	}
}

func portOf(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// recipeText replaces each old string of a shipped file by its new one,
// failing when one is no longer there: the recipe changed and the test
// must follow it.
func recipeText(t *testing.T, name, text string, pairs ...string) string {
	t.Helper()
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(text, pairs[i]) {
			t.Fatalf("%s no longer contains %q: update the test with the recipe", name, pairs[i])
		}
		text = strings.ReplaceAll(text, pairs[i], pairs[i+1])
	}
	return text
}

// TestRecipeExampleConfigs runs README's configuration block (build,
// copy the example, check it, serve it) with configs/greyrelay.example.yaml
// edited only where its comment says (addresses, paths, TLS files), then
// configs/container.yaml through config check and a real start, and
// README's listener example for applications with a message over
// STARTTLS and AUTH. The shipped examples must check without warnings
// but one: their hostname, relay.example.com, does not resolve.
func TestRecipeExampleConfigs(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	root, dir := moduleRoot(t), t.TempDir()
	ip := relaytest.Loopback(t)
	cert := peers.NewCert(t, "relay.example.com", ip)
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, cert.CertFile, filepath.Join(etc, "cert.pem"))
	copyFile(t, cert.KeyFile, filepath.Join(etc, "key.pem"))
	users := rbUsersFile(t, "app", "app-pw", "")
	copyFile(t, users, filepath.Join(etc, "users"))

	block := recipeBlocks(t, "TestRecipeExampleConfigs")
	if len(block) != 2 || block[0].Lang != "sh" || block[1].Lang != "yaml" {
		t.Fatalf("README's blocks for this test: %+v, want the configuration commands and the application listener", block)
	}
	lines := strings.Split(strings.TrimSpace(block[0].Text), "\n")
	if len(lines) != 4 || !strings.Contains(lines[3], " serve ") {
		t.Fatalf("README's configuration block changed (want build, cp, check, serve):\n%s", block[0].Text)
	}
	bin := filepath.Join(dir, "greyrelay")
	subst := []string{"/etc/greyrelay/", etc + "/", "-o greyrelay", "-o " + bin, "./greyrelay ", bin + " "}
	recipeText(t, block[0].File, block[0].Text, subst...)
	sh := strings.NewReplacer(subst...).Replace
	for _, line := range lines[:2] {
		if res := runShell(t, root, sh(strings.Split(line, "#")[0])); res.Code != 0 {
			t.Fatalf("README's %q: %s", line, res)
		}
	}
	// "then edit": the addresses, the queue and the source address.
	conf := filepath.Join(etc, "greyrelay.yaml")
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	a25, a587, a465 := peers.FreeAddr(t, ip), peers.FreeAddr(t, ip), peers.FreeAddr(t, ip)
	edited := recipeText(t, "configs/greyrelay.example.yaml", string(b),
		"127.0.0.1:25\n", a25+"\n", "0.0.0.0:587", a587, "0.0.0.0:465", a465,
		"/etc/greyrelay/", etc+"/", "/var/lib/greyrelay/", dir+"/", "127.0.0.1:8025", peers.FreeAddr(t, ip), "192.0.2.10", ip)
	if err := os.WriteFile(conf, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	res := runShell(t, root, sh(lines[2]))
	if res.Code != 0 || !strings.Contains(res.Stdout, "configuration is valid") || !onlyUnresolvedHostname(res.Stderr, "relay.example.com") {
		t.Fatalf("README's %q: want valid without warnings (but that relay.example.com does not resolve): %s", lines[2], res)
	}
	serve := exec.Command("sh", "-c", "exec "+sh(lines[3]))
	serve.Env = peers.CleanEnv()
	serve.Dir = dir
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer serve.Process.Kill()
	waitGreets(t, map[string]bool{a25: false, a587: false, a465: true})
	submitTLS(t, a587, "app", "app-pw")
	_ = serve.Process.Signal(os.Interrupt)
	if err := serve.Wait(); err != nil {
		t.Errorf("README's serve line: exit %v after SIGINT, want 0", err)
	}

	// configs/container.yaml: its paths and addresses substituted.
	cb, err := os.ReadFile(filepath.Join(root, "configs", "container.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(dir, "admin_token")
	if err := os.WriteFile(token, []byte("recipe-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	container := recipeText(t, "configs/container.yaml", string(cb),
		"0.0.0.0:2525", peers.FreeAddr(t, ip), "0.0.0.0:8025", peers.FreeAddr(t, ip),
		"/etc/greyrelay/tls/", etc+"/", "/run/secrets/greyrelay_users", filepath.Join(etc, "users"),
		"/run/secrets/greyrelay_admin_token", token, "/var/spool/greyrelay/", dir+"/container-")
	cpath := filepath.Join(dir, "container.yaml")
	if err := os.WriteFile(cpath, []byte(container), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := runGreyrelay(t, dir, "", nil, "config", "check", "-config", cpath); res.Code != 0 || !onlyUnresolvedHostname(res.Stderr, "relay.example.com") {
		t.Errorf("configs/container.yaml: want valid without warnings (but that relay.example.com does not resolve): %s", res)
	}
	rc := peers.StartRelay(t, container)
	submitTLS(t, rc.SMTPAddr, "app", "app-pw")
	rc.Stop()

	// README's listener for applications on other hosts.
	app := recipeText(t, block[1].File, block[1].Text, "0.0.0.0:587", peers.FreeAddr(t, ip),
		"/etc/greyrelay/", etc+"/", "192.0.2.10", ip) + "admin: {address: \"\"}\n"
	ra := peers.StartRelay(t, app)
	submitTLS(t, ra.SMTPAddr, "app", "app-pw")
}

// submitTLS sends one message with STARTTLS and AUTH PLAIN and wants 250.
func submitTLS(t *testing.T, addr, user, password string) {
	t.Helper()
	out, code := peers.SwaksMessage{Server: addr, From: "app@app.example", To: []string{"user@dest.example"},
		Data: []byte("From: app@app.example\r\nTo: user@dest.example\r\nSubject: recipe\r\n\r\nhello\r\n"),
		Args: []string{"-tls", "--auth", "PLAIN", "--auth-user", user, "--auth-password", password}}.Send(t)
	if code != 0 {
		t.Errorf("swaks with STARTTLS and AUTH to %s: exit %d\n%s", addr, code, out)
	}
}

// waitGreets waits until every listener answers 220 (true: implicit TLS).
func waitGreets(t *testing.T, addrs map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for a, implicitTLS := range addrs {
		for peers.Greets(a, implicitTLS) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s does not greet", a)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// runShell runs one line of a README.md or docs/ block with sh in dir.
func runShell(t *testing.T, dir, line string) cliResult {
	t.Helper()
	var stdout, stderr strings.Builder
	cmd := exec.Command("sh", "-e", "-c", line)
	cmd.Dir, cmd.Stdout, cmd.Stderr, cmd.Env = dir, &stdout, &stderr, peers.CleanEnv()
	err := cmd.Run()
	res := cliResult{Stdout: stdout.String(), Stderr: stderr.String()}
	if err != nil {
		res.Code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			res.Code = ee.ExitCode()
		}
	}
	return res
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// onlyUnresolvedHostname reports whether stderr of config check holds
// exactly one warning: that host, the example's hostname, does not
// resolve (it is a name to replace; here, with no DNS for it, it cannot).
func onlyUnresolvedHostname(stderr, host string) bool {
	return strings.Count(stderr, "\n") == 1 && strings.HasPrefix(stderr, fmt.Sprintf("warning: hostname: %q does not resolve", host))
}

// TestRecipeSystemdUnit checks configs/greyrelay.service with
// systemd-analyze verify, the binary's path substituted. verify exits 0
// on many mistakes it prints, so any output fails the test too.
func TestRecipeSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("GREYRELAY_REQUIRE_PEERS") != "" {
			t.Fatal("systemd-analyze is not installed (GREYRELAY_REQUIRE_PEERS is set)")
		}
		t.Skip("systemd-analyze is not installed")
	}
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "configs", "greyrelay.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := recipeText(t, "configs/greyrelay.service", string(b), "/usr/local/bin/greyrelay", peers.Binary(t))
	path := filepath.Join(t.TempDir(), "greyrelay.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify greyrelay.service: %v\n%s", err, out)
	}
}

// TestRecipeStartHere runs README's swaks line as written against a relay
// set up like the embedded default (a loopback listener that relays for
// loopback clients), with only the listener's address substituted and
// the recipient's domain routed to a sink: the message must arrive, and
// the status page the README sends the reader to next must answer.
func TestRecipeStartHere(t *testing.T) {
	peers.Require(t, "swaks")
	t.Parallel()
	ip := relaytest.Loopback(t)
	sink := peers.StartSink(t, ip+":0", peers.SinkOptions{})
	cfg := rbRelay{IP: ip, Trusted: []string{"127.0.0.0/8"}, Routes: map[string]string{"example.net": sink.Addr}}
	r := peers.StartRelay(t, cfg.YAML(t))

	blocks := recipeBlocks(t, "TestRecipeStartHere")
	if len(blocks) != 1 || blocks[0].Lang != "sh" || !strings.HasPrefix(blocks[0].Text, "swaks ") {
		t.Fatalf("README's blocks for this test: %+v, want the one swaks line", blocks)
	}
	line := recipeText(t, blocks[0].File, strings.TrimSpace(blocks[0].Text), "127.0.0.1:2525", r.SMTPAddr)
	if res := runShell(t, t.TempDir(), line); res.Code != 0 {
		t.Fatalf("README's %q: %s", line, res)
	}
	m := sink.WaitFor(t, 1, 60*time.Second)[0]
	if m.From != "you@example.com" || len(m.Rcpts) != 1 || m.Rcpts[0] != "you@example.net" ||
		!strings.Contains(string(m.Data), "Subject: greyrelay test") {
		t.Errorf("sink got <%s> -> %v:\n%s", m.From, m.Rcpts, m.Data)
	}
	if code, page := r.Get(t, "/"); code != 200 || !strings.Contains(page, "<html") {
		t.Errorf("the status page: %d\n%.300s", code, page)
	}
}
