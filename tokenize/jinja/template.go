package jinja

// The entry points: parsing a template, rendering it with variables, and the static
// analysis its users need.

import (
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"
	"unicode/utf8"
	"unsafe"
)

// Template is a parsed template. It is immutable and safe for concurrent use.
type Template struct {
	body []stmt
}

// Parse parses a template. The source must be valid UTF-8; a template that does not
// parse is an error, as jinja2's TemplateSyntaxError (an unknown filter or test outside
// an if is one too, as in jinja2).
func Parse(source string) (*Template, error) {
	if !utf8.ValidString(source) {
		return nil, errors.New("source is not valid UTF-8")
	}
	body, err := parse(source)
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// Vars are the variables a template is rendered with, the keyword arguments of jinja2's
// Template.render. The zero value holds none.
type Vars struct {
	s scope
}

// Grow makes room for n more variables.
func (vs *Vars) Grow(n int) {
	vs.s.names = slices.Grow(vs.s.names, n)
	vs.s.vals = slices.Grow(vs.s.vals, n)
}

// Set binds name to v, replacing an earlier binding of name.
func (vs *Vars) Set(name string, v Value) { vs.s.set(name, v) }

// Options tune a render.
type Options struct {
	// Now is the clock strftime_now reads (nil: time.Now).
	Now func() time.Time
	// SizeHint is the expected size of the output in bytes: the output buffer starts
	// with that capacity.
	SizeHint int
}

// Render renders the template with the variables vars (nil: none); they shadow the
// globals of the environment. A template's exception is an *Error; a panic of the
// interpreter is recovered and returned as an error mentioning "internal error".
func (t *Template) Render(vars *Vars, opt Options) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("internal error: %v\n%s", p, debug.Stack())
		}
	}()
	e := &evaluator{buf: make([]byte, 0, opt.SizeHint), now: opt.Now}
	if vars != nil {
		e.vars.names, e.vars.vals = vars.s.names, vars.s.vals
	}
	e.vars.parent = &globals
	e.root.parent = &e.vars
	if _, err := e.execBody(t.body, &e.root); err != nil {
		return "", err
	}
	// e.buf is never written again: the string shares its bytes.
	return unsafe.String(unsafe.SliceData(e.buf), len(e.buf)), nil
}

// A Binding is a {% for %} loop or a {% set name = expression %} assignment, as static
// analysis of a template sees it.
type Binding struct {
	Loop bool // a {% for %} loop; otherwise a {% set %} assignment
	// Name is the name bound, "" when the target is a tuple or a namespace attribute.
	Name string
	// Ref describes the iterated or assigned expression when, with the filters, tests
	// and slices applied to it removed, it reads a variable: Ref[0] is the variable and
	// Ref[1], if present, an attribute or a constant string key read from it (x.key or
	// x['key']). Ref is nil for any other expression.
	Ref []string
	// Bare reports that nothing was removed: the expression is that reference itself.
	Bare bool
}

// Bindings returns the template's {% for %} loops and {% set %} assignments in
// document order (jinja2's find_all order: pre-order, including the bodies of macros
// and blocks).
func (t *Template) Bindings() []Binding {
	var out []Binding
	walkStmts(t.body, func(n stmt) bool {
		var b Binding
		var target *target
		var e expr
		switch x := n.(type) {
		case *forStmt:
			b.Loop, target, e = true, x.target, x.iter
		case *setStmt:
			target, e = x.target, x.e
		default:
			return true
		}
		if target.attr == "" && !target.tuple {
			b.Name = target.name
		}
		b.Ref, b.Bare = refOf(e)
		out = append(out, b)
		return true
	})
	return out
}

// refOf reduces an expression to the variable reference it reads (see Binding.Ref),
// as vLLM's _is_var_or_elems_access sees it.
func refOf(e expr) (ref []string, bare bool) {
	bare = true
	for {
		switch x := e.(type) {
		case *filterExpr:
			if x.e == nil {
				return nil, false
			}
			e, bare = x.e, false
			continue
		case *testExpr:
			e, bare = x.e, false
			continue
		case *getitemExpr:
			if _, ok := x.key.(*sliceExpr); ok {
				e, bare = x.obj, false
				continue
			}
		}
		break
	}
	switch x := e.(type) {
	case *nameExpr:
		return []string{x.name}, bare
	case *getitemExpr:
		n, ok := x.obj.(*nameExpr)
		c, ok2 := x.key.(*constExpr)
		if ok && ok2 && c.v.k == KindString {
			return []string{n.name, c.v.s}, bare
		}
	case *getattrExpr:
		if n, ok := x.obj.(*nameExpr); ok {
			return []string{n.name, x.name}, bare
		}
	}
	return nil, false
}

// References reports whether an expression of the template outside macro bodies reads
// the variable name.
func (t *Template) References(name string) bool {
	found := false
	walkExprsInStmts(t.body, func(e expr) {
		if n, ok := e.(*nameExpr); ok && n.name == name {
			found = true
		}
	})
	return found
}
