package tokenize

// What vLLM does to a request before rendering (see chattemplate.go): messages as
// parse_chat_messages rebuilds them for a text-only model, tool calls and tools as
// pydantic validates them, developer messages merged into system for templates that
// do not know them, and the content format the template expects.

import (
	"strings"

	"github.com/kvgate/kvgate/tokenize/jinja"
)

// buildConversation is vLLM's parse_chat_messages for a text-only model.
func buildConversation(msgs []jinja.Value, format contentFormat) ([]jinja.Value, error) {
	conv := make([]jinja.Value, 0, len(msgs))
	for i, m := range msgs {
		if m.Kind() != jinja.KindDict {
			return nil, userErrorf("messages[%d] must be an object", i)
		}
		md := m.Dict()
		role, ok := md.Get("role")
		if !ok || role.Kind() != jinja.KindString {
			return nil, userErrorf("messages[%d].role must be a string", i)
		}
		content, _ := md.Get("content")
		var parts []jinja.Value
		switch content.Kind() {
		case jinja.KindUndefined, jinja.KindNone:
		case jinja.KindString:
			parts = []jinja.Value{textPart(content.String())}
		case jinja.KindList:
			parts = content.Items()
		default:
			return nil, userErrorf("messages[%d].content must be a string or an array of content parts", i)
		}
		contentV, err := parseContentParts(parts, format, i)
		if err != nil {
			return nil, err
		}
		out := jinja.NewDict(6)
		out.Set("role", role)
		out.Set("content", contentV)
		switch role.String() {
		case "assistant":
			if tc, ok := md.Get("tool_calls"); ok && tc.Kind() != jinja.KindNone {
				calls, err := normalizeToolCalls(tc, i)
				if err != nil {
					return nil, err
				}
				if len(calls) > 0 {
					out.Set("tool_calls", jinja.ListValue(calls))
				}
			}
			reasoning, _ := md.Get("reasoning")
			if !reasoning.Truth() {
				reasoning, _ = md.Get("reasoning_content")
			}
			if reasoning.Kind() != jinja.KindUndefined && reasoning.Kind() != jinja.KindNone {
				out.Set("reasoning", reasoning)
				out.Set("reasoning_content", reasoning)
			}
		case "tool":
			if id, ok := md.Get("tool_call_id"); ok {
				out.Set("tool_call_id", id)
			}
			if contentV.Kind() == jinja.KindList {
				items := contentV.Items()
				nonText := false
				var texts []string
				for _, it := range items {
					if it.Kind() == jinja.KindDict {
						t, _ := it.Dict().Get("type")
						if !(t.Kind() == jinja.KindString && t.String() == "text") {
							nonText = true
							break
						}
						x, ok := it.Dict().Get("text")
						if !ok {
							x = jinja.StringValue("")
						}
						if x.Kind() != jinja.KindString {
							return nil, userErrorf("sequence item %d: expected str instance, %s found", len(texts), x.TypeName())
						}
						texts = append(texts, x.String())
					}
				}
				if !nonText {
					out.Set("content", jinja.StringValue(strings.Join(texts, "\n")))
				}
			}
		}
		if name, ok := md.Get("name"); ok && name.Kind() == jinja.KindString {
			out.Set("name", name)
		}
		if task, ok := md.Get("task"); ok && task.Kind() == jinja.KindString {
			out.Set("task", task)
		}
		if role.String() == "developer" {
			t, ok := md.Get("tools")
			if !ok {
				t = jinja.NoneValue()
			}
			out.Set("tools", t)
		}
		conv = append(conv, jinja.DictValue(out))
	}
	return conv, nil
}

func textPart(s string) jinja.Value {
	d := jinja.NewDict(2)
	d.Set("type", jinja.StringValue("text"))
	d.Set("text", jinja.StringValue(s))
	return jinja.DictValue(d)
}

var mediaPartTypes = map[string]bool{
	"image_url": true, "input_image": true, "image_embeds": true, "audio_embeds": true,
	"prompt_embeds": true, "image_pil": true, "audio_url": true, "input_audio": true, "video_url": true,
}

// parseContentParts is _parse_chat_message_content_parts without multimodal data.
func parseContentParts(parts []jinja.Value, format contentFormat, msgIdx int) (jinja.Value, error) {
	wrap := format == formatOpenAI
	var texts []string
	var wrapped []jinja.Value
	for j, p := range parts {
		var text jinja.Value
		switch p.Kind() {
		case jinja.KindString:
			if wrap {
				wrapped = append(wrapped, textPart(p.String()))
			} else if p.String() != "" {
				texts = append(texts, p.String())
			}
			continue
		case jinja.KindDict:
		default:
			return jinja.Value{}, userErrorf("messages[%d].content[%d] must be a string or an object", msgIdx, j)
		}
		pd := p.Dict()
		typ, hasType := pd.Get("type")
		uuid, _ := pd.Get("uuid")
		if !hasType || typ.Kind() == jinja.KindNone || (uuid.Kind() != jinja.KindUndefined && uuid.Kind() != jinja.KindNone) {
			for k := range mediaPartTypes {
				if _, ok := pd.Get(k); ok {
					return jinja.Value{}, userErrorf("messages[%d].content[%d]: %s parts are not supported (text-only model)", msgIdx, j, k)
				}
			}
			if _, ok := pd.Get("tool_reference"); ok {
				typ = jinja.StringValue("tool_reference")
			} else {
				return jinja.Value{}, userErrorf("Missing 'type' field in multimodal part.")
			}
		}
		if typ.Kind() != jinja.KindString {
			return jinja.Value{}, userErrorf("Invalid 'type' field in multimodal part.")
		}
		switch typ.String() {
		case "text", "input_text", "output_text":
			text, _ = pd.Get("text")
		case "refusal":
			text, _ = pd.Get("refusal")
		case "thinking":
			text, _ = pd.Get("thinking")
		case "tool_reference":
			name, _ := pd.Get("name")
			if name.Kind() == jinja.KindUndefined {
				name = jinja.NoneValue()
			}
			if wrap {
				d := jinja.NewDict(2)
				d.Set("type", jinja.StringValue("tool_reference"))
				d.Set("name", name)
				wrapped = append(wrapped, jinja.DictValue(d))
			} else if name.Truth() {
				texts = append(texts, name.String())
			}
			continue
		default:
			if mediaPartTypes[typ.String()] {
				return jinja.Value{}, userErrorf("messages[%d].content[%d]: %s parts are not supported (text-only model)", msgIdx, j, typ.String())
			}
			return jinja.Value{}, userErrorf("Unsupported chat content part type: %s.", jinja.StringValue(typ.String()).Repr())
		}
		if text.Kind() == jinja.KindUndefined || text.Kind() == jinja.KindNone {
			// vLLM skips empty text and refusal parts; the other text-like types
			// become {"type": "text", "text": None} (openai) or are dropped (string)
			if typ.String() != "text" && typ.String() != "refusal" && wrap {
				d := jinja.NewDict(2)
				d.Set("type", jinja.StringValue("text"))
				d.Set("text", jinja.NoneValue())
				wrapped = append(wrapped, jinja.DictValue(d))
			}
			continue
		}
		if text.Kind() != jinja.KindString {
			return jinja.Value{}, userErrorf("messages[%d].content[%d].%s must be a string", msgIdx, j, typ.String())
		}
		if wrap {
			wrapped = append(wrapped, textPart(text.String()))
		} else if text.String() != "" {
			texts = append(texts, text.String())
		}
	}
	if wrap {
		return jinja.ListValue(wrapped), nil
	}
	return jinja.StringValue(strings.Join(texts, "\n")), nil
}

// normalizeToolCalls reproduces pydantic's validation of assistant tool_calls
// followed by vLLM's _postprocess_messages.
func normalizeToolCalls(tc jinja.Value, msgIdx int) ([]jinja.Value, error) {
	if tc.Kind() != jinja.KindList {
		return nil, userErrorf("messages[%d].tool_calls must be an array", msgIdx)
	}
	items := tc.Items()
	out := make([]jinja.Value, 0, len(items))
	for j, it := range items {
		if it.Kind() != jinja.KindDict {
			return nil, userErrorf("messages[%d].tool_calls[%d] must be an object", msgIdx, j)
		}
		src := it.Dict()
		fn, ok := src.Get("function")
		if !ok || fn.Kind() != jinja.KindDict {
			return nil, userErrorf("messages[%d].tool_calls[%d].function must be an object", msgIdx, j)
		}
		call := jinja.NewDict(3)
		if id, ok := src.Get("id"); ok {
			call.Set("id", id)
		}
		f := jinja.NewDict(2)
		args, hasArgs := fn.Dict().Get("arguments")
		if hasArgs {
			f.Set("arguments", decodeArguments(args))
		}
		if name, ok := fn.Dict().Get("name"); ok {
			f.Set("name", name)
		}
		if !hasArgs {
			f.Set("arguments", jinja.DictValue(jinja.NewDict(0)))
		}
		call.Set("function", jinja.DictValue(f))
		if t, ok := src.Get("type"); ok {
			call.Set("type", t)
		}
		out = append(out, jinja.DictValue(call))
	}
	return out, nil
}

// decodeArguments: a JSON string is decoded (invalid -> {}); dicts and lists are kept;
// anything else becomes {}.
func decodeArguments(a jinja.Value) jinja.Value {
	switch a.Kind() {
	case jinja.KindString:
		v, err := jinja.DecodeJSON([]byte(a.String()))
		if err != nil {
			return jinja.DictValue(jinja.NewDict(0))
		}
		return v
	case jinja.KindDict, jinja.KindList:
		return a
	}
	return jinja.DictValue(jinja.NewDict(0))
}

// convertDeveloper turns developer messages into system messages and merges the
// system messages into one leading message, for templates without a developer role.
func convertDeveloper(conv []jinja.Value) ([]jinja.Value, error) {
	has := false
	for _, m := range conv {
		if r, _ := m.Dict().Get("role"); r.String() == "developer" {
			has = true
			break
		}
	}
	if !has {
		return conv, nil
	}
	converted := make([]jinja.Value, len(conv))
	for i, m := range conv {
		d := m.Dict()
		if r, _ := d.Get("role"); r.String() != "developer" {
			converted[i] = m
			continue
		}
		nd := jinja.NewDict(d.Len())
		for k, v := range d.All() {
			switch k.String() {
			case "role":
				nd.Set("role", jinja.StringValue("system"))
			case "tools":
			default:
				nd.Set(k.String(), v)
			}
		}
		converted[i] = jinja.DictValue(nd)
	}
	var contents []string
	var rest []jinja.Value
	needs := false
	for i, m := range converted {
		d := m.Dict()
		if r, _ := d.Get("role"); r.String() != "system" {
			rest = append(rest, m)
			continue
		}
		if i > 0 || len(contents) > 0 {
			needs = true
		}
		c, ok := d.Get("content")
		if !ok {
			c = jinja.StringValue("")
		}
		if c.Kind() == jinja.KindList {
			var parts []string
			for _, p := range c.Items() {
				switch p.Kind() {
				case jinja.KindDict:
					if t, ok := p.Dict().Get("text"); ok {
						if t.Kind() != jinja.KindString {
							return nil, userErrorf("sequence item %d: expected str instance, %s found", len(parts), t.TypeName())
						}
						parts = append(parts, t.String())
					}
				case jinja.KindString:
					parts = append(parts, p.String())
				}
			}
			c = jinja.StringValue(strings.Join(parts, "\n"))
		}
		if c.Truth() {
			contents = append(contents, c.String())
		}
	}
	if !needs {
		return converted, nil
	}
	merged := jinja.NewDict(2)
	merged.Set("role", jinja.StringValue("system"))
	merged.Set("content", jinja.StringValue(strings.Join(contents, "\n\n")))
	return append([]jinja.Value{jinja.DictValue(merged)}, rest...), nil
}

// normalizeTools is [ChatCompletionToolsParam(**t).model_dump() for t in tools].
func normalizeTools(tv jinja.Value) (jinja.Value, error) {
	if tv.Kind() != jinja.KindList {
		return jinja.Value{}, userErrorf("tools must be an array")
	}
	items := tv.Items()
	out := make([]jinja.Value, len(items))
	for i, t := range items {
		if t.Kind() != jinja.KindDict {
			return jinja.Value{}, userErrorf("tools[%d] must be an object", i)
		}
		td := t.Dict()
		typ, ok := td.Get("type")
		if ok && !(typ.Kind() == jinja.KindString && typ.String() == "function") {
			return jinja.Value{}, userErrorf("tools[%d].type must be \"function\"", i)
		}
		fn, ok := td.Get("function")
		if !ok || fn.Kind() != jinja.KindDict {
			return jinja.Value{}, userErrorf("tools[%d].function must be an object", i)
		}
		fd := fn.Dict()
		name, ok := fd.Get("name")
		if !ok || name.Kind() != jinja.KindString {
			return jinja.Value{}, userErrorf("tools[%d].function.name must be a string", i)
		}
		desc, ok := fd.Get("description")
		if !ok {
			desc = jinja.NoneValue()
		} else if desc.Kind() != jinja.KindString && desc.Kind() != jinja.KindNone {
			return jinja.Value{}, userErrorf("tools[%d].function.description must be a string", i)
		}
		params, ok := fd.Get("parameters")
		if !ok {
			params = jinja.NoneValue()
		} else if params.Kind() != jinja.KindDict && params.Kind() != jinja.KindNone {
			return jinja.Value{}, userErrorf("tools[%d].function.parameters must be an object", i)
		}
		f := jinja.NewDict(fd.Len() + 3)
		f.Set("name", name)
		f.Set("description", desc)
		f.Set("parameters", params)
		for key, v := range fd.All() {
			switch key.String() {
			case "name", "description", "parameters":
			default:
				f.Set(key.String(), v)
			}
		}
		tool := jinja.NewDict(td.Len() + 2)
		tool.Set("type", jinja.StringValue("function"))
		tool.Set("function", jinja.DictValue(f))
		for key, v := range td.All() {
			switch key.String() {
			case "type", "function":
			default:
				tool.Set(key.String(), v)
			}
		}
		out[i] = jinja.DictValue(tool)
	}
	return jinja.ListValue(out), nil
}

// ---- content format detection (vLLM _detect_content_format) ----

// detectContentFormat returns "openai" when the template iterates over message
// content. Where vLLM's detector would hit an assertion (a tuple target where it
// expects a name) it falls back to "string", as vLLM does.
func detectContentFormat(tpl *jinja.Template) contentFormat {
	bindings := tpl.Bindings()
	// variables holding messages: "messages" and names assigned from it
	msgVars := []string{"messages"}
	queue := []string{"messages"}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, b := range bindings {
			if b.Loop || !isVarOrElemsAccess(b, v, "") {
				continue
			}
			if b.Name == "" {
				return formatString
			}
			msgVars = append(msgVars, b.Name)
			if b.Name != v {
				queue = append(queue, b.Name)
			}
		}
	}
	// loop variables over messages
	var messageVars []string
	for _, b := range bindings {
		if !b.Loop {
			continue
		}
		for _, mv := range msgVars {
			if isVarOrElemsAccess(b, mv, "") {
				if b.Name == "" {
					return formatString
				}
				messageVars = append(messageVars, b.Name)
				break
			}
		}
	}
	// the first loop over a message's content decides
	for _, b := range bindings {
		if !b.Loop {
			continue
		}
		over := b.Bare && len(b.Ref) == 1 && b.Ref[0] == "content"
		for _, mv := range messageVars {
			over = over || isVarOrElemsAccess(b, mv, "content")
		}
		if over {
			if b.Name == "" {
				return formatString
			}
			return formatOpenAI
		}
	}
	return formatString
}

// isVarOrElemsAccess mirrors vLLM's _is_var_or_elems_access(node, varname, key) for
// the expression a binding iterates or assigns.
func isVarOrElemsAccess(b jinja.Binding, varname, key string) bool {
	if key == "" {
		return len(b.Ref) == 1 && b.Ref[0] == varname
	}
	return len(b.Ref) == 2 && b.Ref[0] == varname && b.Ref[1] == key
}
