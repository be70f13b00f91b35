package jinja

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestRenderVars pins the scoping of Render: variables shadow the globals, a top-level
// {% set %} shadows a variable for the rest of that render only, and the same Vars
// render again (and concurrently) unchanged.
func TestRenderVars(t *testing.T) {
	tpl, err := Parse(`{{ x }}|{% set x = 'local' %}{{ x }}|{{ range }}|{{ messages | length }}`)
	if err != nil {
		t.Fatal(err)
	}
	var vars Vars
	vars.Grow(3)
	vars.Set("x", StringValue("first"))
	vars.Set("range", StringValue("shadowed"))
	vars.Set("messages", ListValue([]Value{NoneValue(), BoolValue(true)}))
	vars.Set("x", StringValue("var"))
	for range 2 {
		got, err := tpl.Render(&vars, Options{})
		if want := "var|local|shadowed|2"; err != nil || got != want {
			t.Fatalf("got %q, %v; want %q", got, err, want)
		}
	}
	if got, err := tpl.Render(nil, Options{SizeHint: 64}); err != nil || !strings.HasPrefix(got, "|local|<") || !strings.HasSuffix(got, "|0") {
		t.Errorf("nil vars: got %q, %v; want x undefined, the range global and no messages", got, err)
	}
}

func TestRenderErrors(t *testing.T) {
	tpl, err := Parse(`{{ raise_exception('no ' ~ what) }}`)
	if err != nil {
		t.Fatal(err)
	}
	var vars Vars
	vars.Set("what", StringValue("way"))
	_, err = tpl.Render(&vars, Options{})
	var je *Error
	if !errors.As(err, &je) || je.Type != "TemplateError" || je.Message != "no way" {
		t.Errorf("raise_exception: got %#v", err)
	}
	if _, err := Parse("{{ '\xff' }}"); err == nil {
		t.Error("invalid UTF-8: want an error")
	}
	if _, err := Parse(`{% if x %}`); err == nil {
		t.Error("unclosed if: want an error")
	}
}

func TestBindings(t *testing.T) {
	tpl, err := Parse(`{% set ms = messages[1:] | list %}{% set ns.a = messages %}{% set a, b = c %}` +
		`{% for m in ms %}{% for p in m['content'] %}{% endfor %}{% endfor %}` +
		`{% macro f() %}{% for x in content %}{{ other }}{% endfor %}{% endmacro %}{% for k, v in d.items() %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Binding{
		{Name: "ms", Ref: []string{"messages"}},
		{Ref: []string{"messages"}, Bare: true},
		{Ref: []string{"c"}, Bare: true},
		{Loop: true, Name: "m", Ref: []string{"ms"}, Bare: true},
		{Loop: true, Name: "p", Ref: []string{"m", "content"}, Bare: true},
		{Loop: true, Name: "x", Ref: []string{"content"}, Bare: true},
		{Loop: true},
	}
	if got := tpl.Bindings(); !reflect.DeepEqual(got, want) {
		t.Errorf("bindings\n got %+v\nwant %+v", got, want)
	}
	if !tpl.References("messages") || !tpl.References("d") || tpl.References("other") {
		t.Errorf("References: messages %v, d %v, other (only in a macro body) %v",
			tpl.References("messages"), tpl.References("d"), tpl.References("other"))
	}
}
