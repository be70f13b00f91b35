package jinja

// Parser: jinja2.parser.Parser's grammar for the statements a chat template can use:
// if/elif/else, for (with else, if-filter, recursive), set (incl. namespace attributes
// and block sets), macro, call, filter, with, block, raw, break/continue (loopcontrols)
// and generation (transformers' AssistantTracker). include, import, from and extends
// parse but fail when executed, as they do in transformers (no loader). Expressions are
// in parse_expr.go.

import (
	"fmt"
	"strings"
)

// ---- parser ----

type parser struct {
	toks []token
	pos  int
	soft int // >0 inside if/conditional expressions: unknown filters fail at run time
	// endStack holds the names that end the blocks being parsed, for error messages.
	endStack [][]string
	loops    int
	depth    int // nesting of expressions and statements, bounded like Python's recursion
}

// maxNesting bounds expression and statement nesting (jinja2 would hit Python's
// recursion limit on pathological templates).
const maxNesting = 256

func parse(src string) ([]stmt, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, err := p.subparse(nil)
	if err != nil {
		return nil, err
	}
	if p.cur().t != tokEOF {
		return nil, p.fail("unexpected %s", p.cur().describe())
	}
	return body, nil
}

func (p *parser) cur() token { return p.toks[p.pos] }

func (p *parser) look() token {
	if p.pos+1 < len(p.toks) {
		return p.toks[p.pos+1]
	}
	return p.toks[len(p.toks)-1]
}

func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) fail(format string, args ...any) error {
	return &syntaxError{msg: fmt.Sprintf(format, args...), line: p.cur().line}
}

func (p *parser) isOp(op string) bool {
	t := p.cur()
	return t.t == tokOp && t.s == op
}

func (p *parser) isName(name string) bool {
	t := p.cur()
	return t.t == tokName && t.s == name
}

func (p *parser) skipOp(op string) bool {
	if p.isOp(op) {
		p.next()
		return true
	}
	return false
}

func (p *parser) skipName(name string) bool {
	if p.isName(name) {
		p.next()
		return true
	}
	return false
}

func (p *parser) expectOp(op string) error {
	if !p.skipOp(op) {
		return p.fail("expected token '%s', got '%s'", op, p.cur().describe())
	}
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.cur()
	if t.t != tokName {
		return "", p.fail("expected token 'name', got '%s'", t.describe())
	}
	p.next()
	return t.s, nil
}

func (p *parser) expect(tt tokenType, what string) error {
	if p.cur().t != tt {
		return p.fail("expected token '%s', got '%s'", what, p.cur().describe())
	}
	p.next()
	return nil
}

// subparse parses template data and statements until a block whose first name is one
// of end (the block_begin is consumed; the name token is current).
func (p *parser) subparse(end []string) ([]stmt, error) {
	var body []stmt
	if end != nil {
		p.endStack = append(p.endStack, end)
		defer func() { p.endStack = p.endStack[:len(p.endStack)-1] }()
	}
	for {
		t := p.cur()
		switch t.t {
		case tokEOF:
			return body, nil
		case tokData:
			body = append(body, &dataStmt{s: t.s})
			p.next()
		case tokVarBegin:
			p.next()
			e, err := p.parseTuple(false, true, nil, false)
			if err != nil {
				return nil, err
			}
			body = append(body, &outputStmt{e: e})
			if err := p.expect(tokVarEnd, "end of print statement"); err != nil {
				return nil, err
			}
		case tokBlockBegin:
			p.next()
			if end != nil && p.cur().t == tokName {
				for _, e := range end {
					if p.cur().s == e {
						return body, nil
					}
				}
			}
			n, err := p.parseStatement()
			if err != nil {
				return nil, err
			}
			if n != nil {
				body = append(body, n)
			}
			if err := p.expect(tokBlockEnd, "end of statement block"); err != nil {
				return nil, err
			}
		default:
			return nil, p.fail("unexpected %s", t.describe())
		}
	}
}

// parseStatements parses the body of a block statement: the current token must be the
// end of the opening tag; it stops at one of end. With drop the end name is consumed.
func (p *parser) parseStatements(end []string, drop bool) ([]stmt, error) {
	p.skipOp(":")
	if err := p.expect(tokBlockEnd, "end of statement block"); err != nil {
		return nil, err
	}
	body, err := p.subparse(end)
	if err != nil {
		return nil, err
	}
	if p.cur().t == tokEOF {
		return nil, p.fail("Unexpected end of template. Jinja was looking for the following tags: %s. The innermost block that needs to be closed is '%s'.",
			strings.Join(quoteAll(end), " or "), strings.TrimPrefix(end[0], "end"))
	}
	if drop {
		p.next()
	}
	return body, nil
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = "'" + x + "'"
	}
	return out
}

func (p *parser) parseStatement() (stmt, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > maxNesting {
		return nil, p.fail("template nesting too deep")
	}
	t := p.cur()
	if t.t != tokName {
		return nil, p.fail("tag name expected")
	}
	switch t.s {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "call":
		return p.parseCallBlock()
	case "filter":
		return p.parseFilterBlock()
	case "with":
		return p.parseWith()
	case "print":
		p.next()
		var items []expr
		for p.cur().t != tokBlockEnd {
			if len(items) > 0 {
				if err := p.expectOp(","); err != nil {
					return nil, err
				}
			}
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			items = append(items, e)
		}
		if len(items) == 1 {
			return &outputStmt{e: items[0]}, nil
		}
		return &outputStmt{e: &concatExpr{args: items}}, nil
	case "break", "continue":
		p.next()
		if p.loops == 0 {
			return nil, p.fail("'%s' outside of a loop", t.s)
		}
		if t.s == "break" {
			return &breakStmt{}, nil
		}
		return &continueStmt{}, nil
	case "generation":
		p.next()
		body, err := p.parseStatements([]string{"endgeneration"}, true)
		if err != nil {
			return nil, err
		}
		return &generationStmt{body: body}, nil
	case "block":
		p.next()
		if _, err := p.expectName(); err != nil {
			return nil, err
		}
		p.skipName("scoped")
		p.skipName("required")
		body, err := p.parseStatements([]string{"endblock"}, true)
		if err != nil {
			return nil, err
		}
		if p.cur().t == tokName {
			p.next() // {% endblock name %}
		}
		return &blockStmt{body: body}, nil
	case "autoescape":
		p.next()
		if _, err := p.parseExpression(true); err != nil {
			return nil, err
		}
		body, err := p.parseStatements([]string{"endautoescape"}, true)
		if err != nil {
			return nil, err
		}
		return &blockStmt{body: body}, nil
	case "include", "import", "from", "extends":
		// These need a template loader; transformers has none, so they fail when run.
		p.next()
		for p.cur().t != tokBlockEnd && p.cur().t != tokEOF {
			p.next()
		}
		return &unsupportedStmt{msg: "no loader for this environment specified"}, nil
	}
	if strings.HasPrefix(t.s, "end") || t.s == "else" || t.s == "elif" {
		if len(p.endStack) > 0 {
			return nil, p.fail("Encountered unknown tag '%s'. Jinja was looking for the following tags: %s.", t.s, strings.Join(quoteAll(p.endStack[len(p.endStack)-1]), " or "))
		}
	}
	return nil, p.fail("Encountered unknown tag '%s'.", t.s)
}

func (p *parser) parseIf() (stmt, error) {
	p.next() // if
	n := &ifStmt{}
	p.soft++
	defer func() { p.soft-- }()
	for {
		test, err := p.parseTuple(false, false, nil, false)
		if err != nil {
			return nil, err
		}
		body, err := p.parseStatements([]string{"elif", "else", "endif"}, false)
		if err != nil {
			return nil, err
		}
		n.tests = append(n.tests, test)
		n.bodies = append(n.bodies, body)
		tok := p.next()
		switch tok.s {
		case "elif":
			continue
		case "else":
			els, err := p.parseStatements([]string{"endif"}, true)
			if err != nil {
				return nil, err
			}
			n.els = els
		}
		return n, nil
	}
}

func (p *parser) parseFor() (stmt, error) {
	p.next() // for
	target, err := p.parseAssignTarget(true, false, []string{"in"}, false)
	if err != nil {
		return nil, err
	}
	if !p.skipName("in") {
		return nil, p.fail("expected token 'in', got '%s'", p.cur().describe())
	}
	iter, err := p.parseTuple(false, false, []string{"recursive"}, false)
	if err != nil {
		return nil, err
	}
	n := &forStmt{target: target, iter: iter}
	if p.skipName("if") {
		if n.cond, err = p.parseExpression(true); err != nil {
			return nil, err
		}
	}
	n.recursive = p.skipName("recursive")
	p.loops++
	n.body, err = p.parseStatements([]string{"endfor", "else"}, false)
	p.loops--
	if err != nil {
		return nil, err
	}
	if p.next().s == "else" {
		if n.els, err = p.parseStatements([]string{"endfor"}, true); err != nil {
			return nil, err
		}
	}
	n.fresh = definesMacro(n.body)
	return n, nil
}

func definesMacro(body []stmt) bool {
	found := false
	walkStmts(body, func(n stmt) bool {
		switch n.(type) {
		case *macroStmt, *callBlockStmt:
			found = true
		}
		return !found
	})
	return found
}

func (p *parser) parseSet() (stmt, error) {
	p.next() // set
	target, err := p.parseAssignTarget(true, false, nil, true)
	if err != nil {
		return nil, err
	}
	if p.skipOp("=") {
		e, err := p.parseTuple(false, true, nil, false)
		if err != nil {
			return nil, err
		}
		return &setStmt{target: target, e: e}, nil
	}
	filter, err := p.parseFilter(nil, false)
	if err != nil {
		return nil, err
	}
	body, err := p.parseStatements([]string{"endset"}, true)
	if err != nil {
		return nil, err
	}
	return &setBlockStmt{target: target, filter: filter, body: body}, nil
}

func (p *parser) parseWith() (stmt, error) {
	p.next() // with
	n := &withStmt{}
	for p.cur().t != tokBlockEnd {
		if len(n.targets) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		t, err := p.parseAssignTarget(true, false, nil, false)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, t)
		n.vals = append(n.vals, v)
	}
	body, err := p.parseStatements([]string{"endwith"}, true)
	if err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

func (p *parser) parseSignature(m *macro) error {
	if err := p.expectOp("("); err != nil {
		return err
	}
	for !p.isOp(")") {
		if len(m.params) > 0 {
			if err := p.expectOp(","); err != nil {
				return err
			}
		}
		name, err := p.expectName()
		if err != nil {
			return err
		}
		if p.skipOp("=") {
			d, err := p.parseExpression(true)
			if err != nil {
				return err
			}
			m.defaults = append(m.defaults, d)
		} else if len(m.defaults) > 0 {
			return p.fail("non-default argument follows default argument")
		} else if name == "caller" {
			return p.fail("When defining macros or call blocks the special \"caller\" argument must be omitted or be given a default.")
		}
		m.params = append(m.params, name)
	}
	p.next()
	return nil
}

func (p *parser) parseMacro() (stmt, error) {
	p.next() // macro
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	m := &macro{name: name}
	if err := p.parseSignature(m); err != nil {
		return nil, err
	}
	loops := p.loops
	p.loops = 0
	m.body, err = p.parseStatements([]string{"endmacro"}, true)
	p.loops = loops
	if err != nil {
		return nil, err
	}
	macroFlags(m)
	return &macroStmt{m: m}, nil
}

// macroFlags records whether the body references varargs, kwargs or caller
// (jinja2 enables those only for macros that use them).
func macroFlags(m *macro) {
	walkExprsInStmts(m.body, func(e expr) {
		if n, ok := e.(*nameExpr); ok {
			switch n.name {
			case "varargs":
				m.catchVarargs = true
			case "kwargs":
				m.catchKwargs = true
			case "caller":
				m.usesCaller = true
			}
		}
	})
}

func (p *parser) parseCallBlock() (stmt, error) {
	p.next() // call
	caller := &macro{name: "caller"}
	if p.isOp("(") {
		if err := p.parseSignature(caller); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpression(true)
	if err != nil {
		return nil, err
	}
	call, ok := e.(*callExpr)
	if !ok {
		return nil, p.fail("expected call")
	}
	loops := p.loops
	p.loops = 0
	caller.body, err = p.parseStatements([]string{"endcall"}, true)
	p.loops = loops
	if err != nil {
		return nil, err
	}
	macroFlags(caller)
	return &callBlockStmt{call: call, caller: caller}, nil
}

func (p *parser) parseFilterBlock() (stmt, error) {
	p.next() // filter
	f, err := p.parseFilter(nil, true)
	if err != nil {
		return nil, err
	}
	body, err := p.parseStatements([]string{"endfilter"}, true)
	if err != nil {
		return nil, err
	}
	return &filterBlockStmt{filter: f, body: body}, nil
}

// parseAssignTarget mirrors Parser.parse_assign_target.
func (p *parser) parseAssignTarget(withTuple, nameOnly bool, extraEnd []string, withNamespace bool) (*target, error) {
	if withNamespace && p.look().t == tokOp && p.look().s == "." {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		p.next() // dot
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		return &target{name: name, attr: attr}, nil
	}
	if nameOnly {
		name, err := p.expectName()
		if err != nil {
			return nil, err
		}
		return &target{name: name}, nil
	}
	var e expr
	var err error
	if withTuple {
		e, err = p.parseTuple(true, true, extraEnd, false)
	} else {
		e, err = p.parsePrimary()
	}
	if err != nil {
		return nil, err
	}
	return p.toTarget(e)
}

func (p *parser) toTarget(e expr) (*target, error) {
	switch x := e.(type) {
	case *nameExpr:
		switch x.name {
		case "true", "false", "none", "True", "False", "None":
			return nil, p.fail("can't assign to 'const'")
		}
		return &target{name: x.name}, nil
	case *tupleExpr:
		t := &target{tuple: true}
		for _, it := range x.items {
			sub, err := p.toTarget(it)
			if err != nil {
				return nil, err
			}
			t.elems = append(t.elems, sub)
		}
		return t, nil
	}
	return nil, p.fail("can't assign to %s", exprKindName(e))
}

func exprKindName(e expr) string {
	switch e.(type) {
	case *constExpr:
		return "'const'"
	case *callExpr:
		return "'call'"
	case *getattrExpr:
		return "'getattr'"
	case *getitemExpr:
		return "'getitem'"
	case *listExpr:
		return "'list'"
	}
	return "'expression'"
}
