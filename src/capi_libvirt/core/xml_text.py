"""What may go into libvirt's XML as text, and the one way it goes in: as element text or attribute values through
ElementTree (which escapes them), never spliced into a string; values XML cannot carry are refused, not written."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

# Characters XML 1.0 cannot carry at all, even escaped: ElementTree would write them and nothing could read them back.
# Plus the carriage return: ElementTree writes it unescaped in element text, and every XML parser (libvirt's too)
# reads it back as a newline, so the value would silently change.
XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\r\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def text_element(parent: ET.Element, tag: str, text: str, **attributes: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attributes)
    element.text = text
    return element


def check_xml_text(what: str, value: object) -> None:
    if isinstance(value, str) and XML_INVALID.search(value):
        raise ValueError(f"{what} contains characters XML cannot carry")
