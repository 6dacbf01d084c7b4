package config

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The checks here run before yaml decodes a file into Config, on the
// parsed node tree, because the decoder alone cannot explain a mistake
// well: it stops at the first syntax error and reports the line where the
// enclosing block began, it has no suggestion for a misspelt key, and it
// knows only Go's duration syntax.

// fileError is one problem at a line of the operator's file.
func fileError(line int, key, format string, args ...any) error {
	where := fmt.Sprintf("line %d", line)
	if key != "" {
		where += " (key " + key + ")"
	}
	return fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...))
}

var yamlLine = regexp.MustCompile(`^line \d+: `)

// syntaxError rewrites yaml's syntax error with the line the mistake is
// on. yaml names the line where the enclosing block starts (for a list
// item indented one space too far, the line of the list's key), so the
// line is found again: it is the one after the longest prefix of the file
// that still parses, since a prefix of a block-style document ending at a
// line break is a document of its own.
func syntaxError(src []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = yamlLine.ReplaceAllString(msg, "")
	lines := strings.SplitAfter(string(src), "\n")
	line := 1
	// Bounded: a configuration file has tens of lines, not thousands.
	for n := len(lines) - 1; n > 0 && n > len(lines)-500; n-- {
		var probe yaml.Node
		if yaml.Unmarshal([]byte(strings.Join(lines[:n], "")), &probe) == nil {
			line = n + 1
			break
		}
	}
	hint := ""
	if strings.Contains(msg, "expected") || strings.Contains(msg, "not allowed in this context") {
		hint = " (check the indentation: keys of one mapping start in the same column)"
	}
	if strings.Contains(msg, "cannot start any token") && strings.Contains(lines[min(line, len(lines))-1], "\t") {
		hint = " (YAML indents with spaces, not tabs)"
	}
	return fileError(line, "", "%s%s", msg, hint)
}

// keyChecker walks a parsed document alongside the Go type it will be
// decoded into: it reports unknown keys (with a suggestion) and durations
// that do not parse, and rewrites every valid duration in Go's syntax so
// that yaml's decoder, which knows only that syntax, accepts it.
type keyChecker struct {
	all  []string // every key path of Config, for "did you mean" across sections
	errs []error
}

var unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()

// walk reports false when n holds a duration that does not parse: its
// key is then taken out of the document, so that the field keeps its
// default and the decoder does not report the same mistake again.
func (k *keyChecker) walk(n *yaml.Node, t reflect.Type, path string) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	ok := true
	switch {
	case n == nil || n.Kind == yaml.AliasNode || reflect.PointerTo(t).Implements(unmarshalerType):
	case n.Kind == yaml.DocumentNode:
		for _, c := range n.Content {
			ok = k.walk(c, t, path) && ok
		}
	case t == durationType:
		ok = k.duration(n, path)
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		k.mapping(n, t, path)
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, c := range n.Content {
			ok = k.walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)) && ok
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			ok = k.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)) && ok
		}
	}
	return ok
}

// mapping checks the keys of one mapping decoded into the struct type t,
// and drops the pairs with a problem already reported.
func (k *keyChecker) mapping(n *yaml.Node, t reflect.Type, path string) {
	kept := n.Content[:0]
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		f, ok := fieldByTag(t, key.Value)
		if !ok {
			k.errs = append(k.errs, fileError(key.Line, "", "unknown key %s%s",
				join(path, key.Value), k.suggest(key.Value, tags(t), path)))
			continue
		}
		if k.walk(val, f.Type, join(path, key.Value)) {
			kept = append(kept, key, val)
		}
	}
	n.Content = kept
}

// duration checks one duration scalar and rewrites it in Go's syntax.
func (k *keyChecker) duration(n *yaml.Node, path string) bool {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return true // the decoder reports a list or mapping given for a duration
	}
	d, err := ParseDuration(n.Value)
	if err != nil {
		k.errs = append(k.errs, fileError(n.Line, path, "%v", err))
		return false
	}
	n.Value, n.Tag, n.Style = d.String(), "!!str", 0
	return true
}

// suggest proposes the nearest sibling key, or else a key of that name in
// another section (lifetime written at the top level: retry.lifetime).
func (k *keyChecker) suggest(key string, siblings []string, path string) string {
	if s := nearest(key, siblings); s != "" {
		return fmt.Sprintf(" (did you mean %s?)", join(path, s))
	}
	for _, p := range k.all {
		if p == key || strings.HasSuffix(p, "."+key) {
			return fmt.Sprintf(" (did you mean %s?)", p)
		}
	}
	return ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func yamlTag(f reflect.StructField) string {
	return strings.Split(f.Tag.Get("yaml"), ",")[0]
}

func fieldByTag(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() && yamlTag(f) == key && key != "" && key != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tags(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		if f := t.Field(i); f.IsExported() && yamlTag(f) != "" && yamlTag(f) != "-" {
			out = append(out, yamlTag(f))
		}
	}
	return out
}

// allKeyPaths lists every key path below t ("retry.lifetime"); list elements
// appear without an index.
func allKeyPaths(t reflect.Type, prefix string) []string {
	var out []string
	for _, tag := range tags(t) {
		f, _ := fieldByTag(t, tag)
		ft := f.Type
		out = append(out, prefix+tag)
		if ft.Kind() == reflect.Slice || ft.Kind() == reflect.Map {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != durationType && !reflect.PointerTo(ft).Implements(unmarshalerType) {
			out = append(out, allKeyPaths(ft, prefix+tag+".")...)
		}
	}
	return out
}

// nearest returns the candidate closest to s in edit distance, if it is
// close enough to be a typing mistake.
func nearest(s string, candidates []string) string {
	best, bestD := "", max(2, len(s)/4)+1
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(s), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is Levenshtein's distance over bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// EnvConfigFile names the configuration file when no -config is given
// (the container's way); it is the one GREYRELAY_ variable that is not a key.
const EnvConfigFile = EnvPrefix + "CONFIG"

var envIndex = regexp.MustCompile(`_[0-9]+_`)

// checkEnv refuses GREYRELAY_ variables that name no key: a misspelt one
// would otherwise be ignored without a word, and containers set almost
// everything this way.
func checkEnv(environ []string) []error {
	known := envNames(reflect.TypeOf(Config{}), EnvPrefix)
	known = append(known, EnvConfigFile)
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		generic := envIndex.ReplaceAllString(name, "_#_")
		if slices.Contains(known, generic) {
			continue
		}
		hint := ""
		if s := nearest(generic, known); s != "" {
			idx := envIndex.FindString(name)
			hint = fmt.Sprintf(" (did you mean %s?)", strings.Replace(s, "_#_", idx, 1))
		}
		errs = append(errs, fmt.Errorf("environment %s: not a greyrelay setting%s", name, hint))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errs
}

// envNames lists the variables applyEnv reads, with # for a list index.
func envNames(t reflect.Type, prefix string) []string {
	var out []string
	for _, tag := range tags(t) {
		f, _ := fieldByTag(t, tag)
		name := prefix + strings.ToUpper(tag)
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type != durationType:
			out = append(out, envNames(f.Type, name+"_")...)
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			out = append(out, envNames(f.Type.Elem(), name+"_#_")...)
		default:
			out = append(out, name)
		}
	}
	return out
}
