-- The dissector's logic. lhc_ina.wiresharkgen puts the generated table LHC (constants, codes and the header
-- layout, from lhc_ina/constants.py and lhc_ina/wire.py) in front of this text: nothing below writes a
-- protocol number, an offset or a width of its own. Lua 5.1 to 5.4 (no bit operators, no bit library).

local proto = Proto("lhc", "lhc in-network aggregation")
proto.prefs.workers = Pref.uint("Workers per job (W)", 0,
    "The job's worker count, for checking that a RESULT holds every rank's bit (ranks 0..W-1). 0: not known; " ..
    "then a result must hold every rank below its highest set bit (ranks are given from 0 without gaps).")

local F = {}
local fields = {}
for _, field in ipairs(LHC.FIELDS) do
    local make = ProtoField["uint" .. field.bytes * 8]
    local values = field.values and LHC[field.values] or nil
    F[field.name] = make("lhc." .. field.name, field.label, field.hex and base.HEX or base.DEC, values, field.mask)
    fields[#fields + 1] = F[field.name]
end
F.rank = ProtoField.uint8("lhc.bitmap.rank", "Rank", base.DEC)
F.ranks = ProtoField.string("lhc.bitmap.ranks", "Ranks")
F.count = ProtoField.uint8("lhc.bitmap.count", "Contributors", base.DEC)
F.lanes = ProtoField.uint16("lhc.lanes", "Lanes", base.DEC)
F.lane_add = ProtoField.int32("lhc.lane.add", "Lane (ADD, int32)", base.DEC)
F.lane_or = ProtoField.uint32("lhc.lane.or", "Lane (OR, bitmap word)", base.HEX)
F.lane_word = ProtoField.uint32("lhc.lane.word", "Lane (unknown op)", base.HEX)
F.malformed = ProtoField.string("lhc.malformed", "Malformed")
F.payload = ProtoField.none("lhc.payload", "Payload")
for _, name in ipairs({ "rank", "ranks", "count", "lanes", "lane_add", "lane_or", "lane_word", "malformed", "payload" }) do
    fields[#fields + 1] = F[name]
end
proto.fields = fields

local E = {
    malformed = ProtoExpert.new("lhc.expert.malformed", "Malformed lhc packet", expert.group.MALFORMED,
        expert.severity.ERROR),
    unknown_type = ProtoExpert.new("lhc.expert.unknown_type", "Unknown lhc message type", expert.group.PROTOCOL,
        expert.severity.WARN),
    unknown_op = ProtoExpert.new("lhc.expert.unknown_op", "Unknown lhc op", expert.group.PROTOCOL,
        expert.severity.WARN),
    missing_ranks = ProtoExpert.new("lhc.expert.missing_ranks", "Result without every rank's bit",
        expert.group.SEQUENCE, expert.severity.WARN),
    foreign_ranks = ProtoExpert.new("lhc.expert.foreign_ranks", "Result with bits of ranks >= W",
        expert.group.SEQUENCE, expert.severity.WARN),
    retx = ProtoExpert.new("lhc.expert.retx", "Retransmitted result", expert.group.SEQUENCE, expert.severity.NOTE),
    cut = ProtoExpert.new("lhc.expert.cut", "Capture cut short", expert.group.UNDECODED, expert.severity.NOTE),
}
proto.experts = { E.malformed, E.unknown_type, E.unknown_op, E.missing_ranks, E.foreign_ranks, E.retx, E.cut }

-- A field's value: its bits within its byte group (TvbRange:bitfield counts from the group's first bit).
local function value_of(tvb, field)
    return tvb(field.offset, field.bytes):bitfield(field.bytes * 8 - field.shift - field.width, field.width)
end

local function has_bit(word, bit)
    return math.floor(word / 2 ^ bit) % 2 == 1
end

local function ranks_of(bitmap)
    local ranks = {}
    for rank = 0, LHC.MAX_WORKERS - 1 do
        if has_bit(bitmap, rank) then
            ranks[#ranks + 1] = rank
        end
    end
    return ranks
end

local function malformed(root, pinfo, why)
    root:add(F.malformed, why):set_generated()
    root:add_proto_expert_info(E.malformed, "Malformed lhc packet: " .. why)
    root:append_text(" [Malformed: " .. why .. "]")
    pinfo.cols.info:append(" [Malformed: " .. why .. "]")
end

-- Which ranks a result lacks: with W known, every rank below W; with W unknown (0), every rank below the
-- highest bit set (a bitmap that is not contiguous from rank 0), or every rank when no bit is set.
local function check_ranks(item, ranks, workers)
    local have, missing, foreign = {}, {}, {}
    for _, rank in ipairs(ranks) do
        have[rank] = true
        if workers > 0 and rank >= workers then
            foreign[#foreign + 1] = rank
        end
    end
    if workers == 0 and #ranks == 0 then
        item:add_proto_expert_info(E.missing_ranks, "Result without any rank's bit")
        return
    end
    local top = workers > 0 and workers - 1 or ranks[#ranks]
    for rank = 0, top do
        if not have[rank] then
            missing[#missing + 1] = rank
        end
    end
    if #missing > 0 then
        item:add_proto_expert_info(E.missing_ranks, "Result without the bit of rank(s) " ..
            table.concat(missing, ", ") .. (workers > 0 and string.format(" (W = %d)", workers) or ""))
    end
    if #foreign > 0 then
        item:add_proto_expert_info(E.foreign_ranks, string.format("Result with the bit of rank(s) %s, W = %d",
            table.concat(foreign, ", "), workers))
    end
end

local function dissect_bitmap(item, bitmap, msg_type)
    local ranks = ranks_of(bitmap)
    item:add(F.ranks, table.concat(ranks, ", ")):set_generated()
    item:add(F.count, #ranks):set_generated()
    for _, rank in ipairs(ranks) do
        item:add(F.rank, rank):set_generated()
    end
    if msg_type == LHC.MSG.RESULT or msg_type == LHC.MSG.RESULT_RETX then
        check_ranks(item, ranks, proto.prefs.workers)
    end
end

local function dissect_payload(tvb, root, op)
    local bytes = tvb:len() - LHC.HEADER_BYTES
    local lanes = math.min(math.floor(bytes / LHC.LANE_BYTES), LHC.LANES)
    local field, kind, format = F.lane_word, "unknown op: words", "Lane %d: 0x%08x"
    if op == LHC.OP.ADD then
        field, kind, format = F.lane_add, "ADD: int32 counters", "Lane %d: %d"
    elseif op == LHC.OP.OR then
        field, kind, format = F.lane_or, "OR: bitmap words", "Lane %d: 0x%08x"
    end
    local tree = root
    if bytes > 0 then
        tree = root:add(F.payload, tvb(LHC.HEADER_BYTES, bytes))
        tree:set_text(string.format("Payload: %d lanes (%s)", lanes, kind))
    end
    tree:add(F.lanes, lanes):set_generated()
    for lane = 0, lanes - 1 do
        local range = tvb(LHC.HEADER_BYTES + lane * LHC.LANE_BYTES, LHC.LANE_BYTES)
        local value = op == LHC.OP.ADD and range:int() or range:uint()
        tree:add(field, range):set_text(string.format(format, lane, value))
    end
end

-- length: the bytes captured, all that is read; sent: the datagram's length on the wire, which the checks
-- judge (a capture with a small snap length cuts packets short without making them malformed).
function proto.dissector(tvb, pinfo, tree)
    local length, sent = tvb:len(), tvb:reported_len()
    pinfo.cols.protocol = "LHC"
    local root = length > 0 and tree:add(proto, tvb()) or tree:add(proto)
    if length < sent then
        root:add_proto_expert_info(E.cut, string.format("Capture cut short: %d of the datagram's %d bytes",
            length, sent))
    end
    if length < LHC.HEADER_BYTES then
        for _, field in ipairs(LHC.FIELDS) do -- the fields whose bytes arrived
            if field.offset + field.bytes <= length then
                root:add(F[field.name], tvb(field.offset, field.bytes))
            end
        end
        pinfo.cols.info:set("lhc")
        if sent < LHC.HEADER_BYTES then
            malformed(root, pinfo, string.format("truncated header: %d of %d bytes", sent, LHC.HEADER_BYTES))
        end
        return length
    end
    local v, items = {}, {}
    for _, field in ipairs(LHC.FIELDS) do
        v[field.name] = value_of(tvb, field)
        items[field.name] = root:add(F[field.name], tvb(field.offset, field.bytes))
    end
    local type_name = LHC.MSG_TYPES[v.msg_type] or string.format("type %d", v.msg_type)
    local op_name = LHC.OPS[v.op] or string.format("op %d", v.op)
    local info = { type_name, op_name }
    for _, field in ipairs(LHC.FIELDS) do
        if field.info then
            info[#info + 1] = string.format(field.hex and "%s=0x%x" or "%s=%d", field.info, v[field.name])
        end
    end
    pinfo.cols.info:set(table.concat(info, " "))
    root:append_text(string.format(", %s, job %d, rank %d, slot %d, seq %d", type_name, v.job_id, v.worker_id,
        v.slot, v.seq))
    dissect_bitmap(items.bitmap, v.bitmap, v.msg_type)
    if not LHC.MSG_TYPES[v.msg_type] then
        items.msg_type:add_proto_expert_info(E.unknown_type, string.format("Unknown lhc message type %d", v.msg_type))
    end
    if not LHC.OPS[v.op] then
        items.op:add_proto_expert_info(E.unknown_op, string.format("Unknown lhc op %d", v.op))
    end
    if v.msg_type == LHC.MSG.RESULT_RETX then
        items.msg_type:add_proto_expert_info(E.retx, string.format(
            "RESULT_RETX: the result of seq %d again, for rank %d, which sent its DATA twice", v.seq, v.worker_id))
    end
    dissect_payload(tvb, root, v.op)
    if v.flags ~= 0 then
        malformed(root, pinfo, string.format("reserved flags = %d, must be 0", v.flags))
    end
    if sent ~= LHC.HEADER_BYTES + LHC.PAYLOAD_BYTES then
        malformed(root, pinfo, string.format("payload of %d bytes: an lhc packet carries %d lanes (%d bytes)",
            sent - LHC.HEADER_BYTES, LHC.LANES, LHC.PAYLOAD_BYTES))
    end
    return length
end

-- Port-based: every UDP port of the lhc range (either end of the datagram).
local udp_port = DissectorTable.get("udp.port")
for port = LHC.UDP_PORT_BASE, LHC.UDP_PORT_BASE + LHC.UDP_PORT_COUNT - 1 do
    udp_port:add(port, proto)
end

-- Heuristic, for lhc on other ports: a datagram of exactly one packet's size, a known type and op, flags 0
-- and a rank below MAX_WORKERS.
local function heuristic(tvb, pinfo, tree)
    if tvb:reported_len() ~= LHC.HEADER_BYTES + LHC.PAYLOAD_BYTES or tvb:len() < LHC.HEADER_BYTES then
        return false
    end
    local v = {}
    for _, field in ipairs(LHC.FIELDS) do
        v[field.name] = value_of(tvb, field)
    end
    if not LHC.MSG_TYPES[v.msg_type] or not LHC.OPS[v.op] or v.flags ~= 0 or v.worker_id >= LHC.MAX_WORKERS then
        return false
    end
    proto.dissector(tvb, pinfo, tree)
    return true
end
proto:register_heuristic("udp", heuristic)
