# Reads the #cloud-config subset gpucloud writes and prints one directive a line:
#   hostname NAME | ssh_pwauth true|false | disable_root true|false
#   shell NAME PATH | groups NAME G1,G2 | user NAME (shell and groups come first)
#   sudo NAME RULE | password NAME HASH | key NAME KEY...
#   file PATH MODE CONTENT (CONTENT with printf %b escapes) | final_message TEXT
# Understood: top-level hostname, ssh_pwauth, disable_root, final_message,
# ssh_authorized_keys (for root), write_files (a list of maps with path,
# content on one line, permissions; owner and defer are read and ignored) and
# users: a list of maps with name, lock_passwd (default true, as in cloud-init),
# hashed_passwd (or passwd), ssh_authorized_keys, shell, sudo (a string; false
# or null: none) and groups (a [flow, list] or a "comma,separated" string).
# Anything else is ignored; invalid names, hashes, keys, shells, groups, sudo
# rules and paths are dropped with a warning.
function warn(msg) { print "gpucloud-test-image: user-data: " msg > "/dev/stderr" }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
# A YAML scalar: 'quoted', "quoted" or plain (then a " #" comment is cut off).
function scalar(s,   q, rest, end) {
  s = trim(s)
  q = substr(s, 1, 1)
  if (q == "\"" || q == "'") {
    rest = substr(s, 2)
    end = index(rest, q)
    if (end > 0) return substr(rest, 1, end - 1)
    return rest
  }
  sub(/[ \t]+#.*$/, "", s)
  return trim(s)
}
function bool(s) {
  s = tolower(scalar(s))
  if (s == "true" || s == "yes" || s == "on") return "true"
  if (s == "false" || s == "no" || s == "off") return "false"
  return ""
}
function valid_key(k) {
  return k ~ /^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[A-Za-z0-9@.-]+) [A-Za-z0-9+\/=]+( [^\t]*)?$/
}
function start_user() {
  flush_user()
  in_user = 1; u_name = ""; u_hash = ""; u_lock = "true"; u_nkeys = 0; in_keys = 0
  u_shell = ""; u_sudo = ""; u_groups = ""
}
# "[a, b]" or "a,b" -> "a,b"; "" when a name is invalid.
function group_list(v,   n, parts, i, g, out) {
  v = trim(v)
  if (substr(v, 1, 1) == "[") { sub(/^\[/, "", v); sub(/\][ \t]*$/, "", v) }
  else v = scalar(v)
  n = split(v, parts, ",")
  out = ""
  for (i = 1; i <= n; i++) {
    g = scalar(parts[i])
    if (g == "") continue
    if (g !~ /^[a-z_][a-z0-9_-]*$/ || length(g) > 32) { warn("invalid group name: user's groups ignored"); return "" }
    out = out (out == "" ? "" : ",") g
  }
  return out
}
# The text of a double-quoted YAML scalar as printf %b reads it (\n \t \\ kept, \" unescaped);
# single-quoted and plain scalars get their backslashes doubled.
function content_b(v,   q, rest, end, out) {
  v = trim(v)
  q = substr(v, 1, 1)
  if (q == "\"") {
    rest = substr(v, 2)
    out = ""
    while (rest != "") {
      if (substr(rest, 1, 1) == "\\") { out = out substr(rest, 1, 2); rest = substr(rest, 3); continue }
      if (substr(rest, 1, 1) == "\"") break
      out = out substr(rest, 1, 1); rest = substr(rest, 2)
    }
    gsub(/\\"/, "\"", out)
    return out
  }
  v = scalar(v)
  gsub(/\\/, "\\\\", v)
  return v
}
function start_file() {
  flush_file()
  in_file = 1; f_path = ""; f_content = ""; f_mode = "0644"
}
function flush_file() {
  if (!in_file) return
  in_file = 0
  if (f_path !~ /^\/[A-Za-z0-9._\/-]+$/ || f_path ~ /(^|\/)\.\.(\/|$)/) { warn("write_files: invalid path ignored"); return }
  if (f_mode !~ /^0?[0-7][0-7][0-7]$/) { warn("write_files: invalid permissions for " f_path); f_mode = "0644" }
  print "file", f_path, f_mode, f_content
}
function flush_user(   i) {
  if (!in_user) return
  in_user = 0; in_keys = 0
  if (u_name == "") { warn("a user without a name was ignored"); return }
  if (u_name !~ /^[a-z_][a-z0-9_-]*$/ || length(u_name) > 32) { warn("invalid user name ignored"); return }
  if (u_shell != "") {
    if (u_shell ~ /^\/[A-Za-z0-9._\/-]+$/) print "shell", u_name, u_shell
    else warn("invalid shell for " u_name " ignored")
  }
  if (u_groups != "") print "groups", u_name, u_groups
  print "user", u_name
  if (u_sudo != "") {
    if (u_sudo ~ /^[A-Za-z0-9_=(),:!\/ .*-]+$/) print "sudo", u_name, u_sudo
    else warn("invalid sudo rule for " u_name " ignored")
  }
  if (u_hash != "") {
    if (u_hash !~ /^\$[.\/0-9A-Za-z$]+$/) warn("invalid hashed_passwd for " u_name " ignored")
    else if (u_lock != "false") warn("password of " u_name " stays locked (lock_passwd is not false)")
    else print "password", u_name, u_hash
  }
  for (i = 1; i <= u_nkeys; i++) print "key", u_name, u_keys[i]
}
function add_key(list, k) {
  k = scalar(k)
  if (k == "") return
  if (!valid_key(k)) { warn("invalid SSH key ignored"); return }
  if (list == "top") top_keys[++n_top] = k
  else u_keys[++u_nkeys] = k
}
# key: value at the start of body -> sets K and V (V empty if none).
function split_kv(body,   p) {
  p = index(body, ":")
  if (p == 0) { K = trim(body); V = ""; return }
  K = trim(substr(body, 1, p - 1)); V = trim(substr(body, p + 1))
}

{ sub(/\r$/, "") }
/^[ \t]*(#.*)?$/ { next }
{
  match($0, /^ */); ind = RLENGTH; body = substr($0, ind + 1)
  # (A list may sit at the same indentation as its key: "users:\n- name: x".)
  if (ind == 0 && !(section != "" && body ~ /^-([ \t]|$)/)) {
    flush_user(); flush_file(); section = ""
    split_kv(body)
    if (K == "users") { section = "users"; dash_ind = -1 }
    else if (K == "write_files") { section = "files"; dash_ind = -1 }
    else if (K == "ssh_authorized_keys") section = "top"
    else if (K == "hostname") print "hostname", scalar(V)
    else if (K == "ssh_pwauth") print "ssh_pwauth", bool(V)
    else if (K == "disable_root") print "disable_root", bool(V)
    else if (K == "final_message") print "final_message", scalar(V)
    next
  }
  if (section == "files") {
    if (body ~ /^-([ \t]|$)/ && (dash_ind < 0 || ind <= dash_ind)) {
      dash_ind = ind
      body = substr(body, 2)
      sub(/^[ \t]*/, "", body)
      start_file()
      if (body == "") next
    }
    if (!in_file) next
    split_kv(body)
    if (K == "path") f_path = scalar(V)
    else if (K == "content") f_content = content_b(V)
    else if (K == "permissions") f_mode = scalar(V)
    next
  }
  if (section == "top") {
    if (body ~ /^-([ \t]|$)/) add_key("top", substr(body, 2))
    next
  }
  if (section != "users") next
  if (body ~ /^-([ \t]|$)/ && (dash_ind < 0 || ind <= dash_ind)) {
    # A new list item: "- name: x" (a map) or "- default" (ignored).
    dash_ind = ind
    body = substr(body, 2)
    match(body, /^[ \t]*/); ind = ind + 1 + RLENGTH; body = substr(body, RLENGTH + 1)
    if (body != "" && index(body, ":") == 0) { flush_user(); next }
    start_user()
    if (body == "") next
  }
  if (!in_user) next
  if (in_keys && body ~ /^-([ \t]|$)/ && ind > dash_ind) { add_key("user", substr(body, 2)); next }
  in_keys = 0
  split_kv(body)
  if (K == "name") u_name = scalar(V)
  else if (K == "hashed_passwd" || K == "passwd") u_hash = scalar(V)
  else if (K == "lock_passwd") u_lock = bool(V)
  else if (K == "shell") u_shell = scalar(V)
  else if (K == "groups") u_groups = group_list(V)
  else if (K == "sudo") { u_sudo = scalar(V); if (u_sudo == "false" || u_sudo == "null" || u_sudo == "~") u_sudo = "" }
  else if (K == "ssh_authorized_keys") {
    if (V == "") in_keys = 1
    else warn("inline ssh_authorized_keys lists are not supported")
  }
}
END {
  flush_user()
  flush_file()
  if (n_top > 0) {
    print "user", "root"
    for (i = 1; i <= n_top; i++) print "key", "root", top_keys[i]
  }
}
