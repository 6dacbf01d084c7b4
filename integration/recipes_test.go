package integration

// Recipe tests: the files users copy (README.md's code blocks and configs/)
// are run as written, with only host names, ports, paths and credentials
// substituted, so that a recipe that stops working fails a test. Each
// README block names the test that runs it in a marker on the line
// before it: <!-- recipe: TestName -->. TestReadmeBlocksAreRecipes checks
// that every block has one.

import (
	"bufio"
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
)

// readmeBlock is one fenced code block of README.md.
type readmeBlock struct {
	Line   int    // of the opening fence
	Lang   string // sh, yaml, python, ...
	Recipe string // the marker's name; "" without a marker
	Text   string
}

var recipeMarker = regexp.MustCompile(`^<!-- recipe: (\S+) -->$`)

// readmeBlocks parses README.md's fenced code blocks and their markers.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	f, err := os.Open(filepath.Join(moduleRoot(t), "README.md"))
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
			cur = &readmeBlock{Line: n, Lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
			if m := recipeMarker.FindStringSubmatch(strings.TrimSpace(prev)); m != nil {
				cur.Recipe = m[1]
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	return blocks
}

// recipeBlocks returns the README blocks whose marker names test, in order,
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
		t.Fatalf("README.md has no block marked <!-- recipe: %s -->", test)
	}
	return out
}

// notRunHere lists the README blocks no test runs, by marker, with why.
var notRunHere = map[string]string{
	"start-here": "`go run` serves the default's fixed ports 2525 and 8025 (shared by parallel tests), " +
		"and `go test ./...` would run this test itself",
	"docker-build-public": "needs a container registry for the public Go image; TestRecipeDocker runs the offline build below it",
}

// recipeLangs are the code blocks that are commands or configuration.
var recipeLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true,
	"yaml": true, "yml": true, "python": true, "ini": true, "toml": true, "json": true}

// configsRecipes maps every file in configs/ to the test that uses it as
// written.
var configsRecipes = map[string]string{
	"configs.go":             "TestDefault_IsValidAndLoopbackOnly", // relay/config: the embedded default
	"default.yaml":           "TestDefault_DocumentsEveryKey",
	"greyrelay.example.yaml": "TestRecipeExampleConfigs",
	"container.yaml":         "TestRecipeExampleConfigs",
	"postfix-smarthost.cf":   "TestRecipePostfixSmarthost",
	"greyrelay.service":      "TestRecipeSystemdUnit",
	"docker-compose.yml":     "TestRecipeDockerCompose",
	"grafana-dashboard.json": "TestGrafanaDashboard",
}

// TestReadmeBlocksAreRecipes: every command or configuration block of
// README.md carries a marker naming the test that runs it (a test
// function of this repository that reads its blocks with recipeBlocks or
// names the marker), or one of the few blocks that cannot run here; and
// every file in configs/ has its test.
func TestReadmeBlocksAreRecipes(t *testing.T) {
	root := moduleRoot(t)
	tests := testFunctions(t, root)
	for _, b := range readmeBlocks(t) {
		if !recipeLangs[b.Lang] {
			continue
		}
		switch {
		case b.Recipe == "":
			t.Errorf("README.md:%d: a %s block without a <!-- recipe: TestName --> marker on the line before it", b.Line, b.Lang)
		case notRunHere[b.Recipe] != "":
		case tests[b.Recipe] == "":
			t.Errorf("README.md:%d: the marker names %s, which is no test function", b.Line, b.Recipe)
		case !strings.Contains(tests[b.Recipe], `"`+b.Recipe+`"`) && !strings.Contains(tests[b.Recipe], "recipeBlocks(t, t.Name())"):
			t.Errorf("README.md:%d: %s does not read its README block (recipeBlocks)", b.Line, b.Recipe)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "configs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
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
	sinkIP, relayIP, clientIP := peers.Loopback(224), peers.Loopback(225), peers.Loopback(226)
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

var _ = exec.Command
