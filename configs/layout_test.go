package configs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLayoutNamesEveryPackage: the Layout section of docs/development.md
// names every Go package of the module, and nothing else.
func TestLayoutNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../docs/development.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("docs/development.md has no Layout section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var named []string
	for _, m := range regexp.MustCompile("`([a-z0-9_/]+)`").FindAllStringSubmatch(sec, -1) {
		named = append(named, m[1])
	}
	var pkgs []string
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			dir, _ := filepath.Rel("..", filepath.Dir(path))
			pkgs = append(pkgs, filepath.ToSlash(dir))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pkgs)
	pkgs = slices.Compact(pkgs)
	slices.Sort(named)
	named = slices.Compact(named)
	for _, p := range pkgs {
		if !slices.Contains(named, p) {
			t.Errorf("package %s is missing from docs/development.md's Layout section", p)
		}
	}
	for _, n := range named {
		if !slices.Contains(pkgs, n) {
			t.Errorf("docs/development.md's Layout section names %s, which is not a package", n)
		}
	}
}
